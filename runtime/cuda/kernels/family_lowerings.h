// The CUDA lowerings of the hand-written kernel families (attention, normalization, loss, gather,
// reduction, optimizer), found by op kind. Each family lives in its own file in this folder; the executor
// asks findFamilyLowering(op) first and falls back to its own codegen (elementwise, movement, matmul).
#pragma once

#include "ir/fusion_group.h"
#include "ir/graph.h"
#include "ir/op.h"
#include "ir/status.h"
#include "runtime/cuda/kernel_spec.h"

namespace tpc::cuda {

using FamilyLowering = Result<NodeLowering> (*)(const Node&, const LoweringContext&);

// The lowering of `op`, or nullptr when no kernel family here handles it.
const FamilyLowering* findFamilyLowering(OpKind op);

// One entry per family file (each defined in that file).
Result<NodeLowering> lowerAttention(const Node& n, const LoweringContext& ctx);       // attention.cpp
Result<NodeLowering> lowerAttentionGrad(const Node& n, const LoweringContext& ctx);   // attention.cpp
Result<NodeLowering> lowerLayerNorm(const Node& n, const LoweringContext& ctx);       // normalization.cpp
Result<NodeLowering> lowerLayerNormGrad(const Node& n, const LoweringContext& ctx);   // normalization.cpp
// Whether lowerLayerNormGrad sums dx for layer_norm_grad `n` given sum_dx (fold-layer-norm-grad-bias-sum asks).
bool layerNormGradSumsDx(const Node& n, const LoweringContext& ctx);  // normalization.cpp
// Whether layer_norm's kernel can add a residual operand (fold-layer-norm-residual): rows of at most 2048.
bool layerNormTakesResidual(const Node& n);  // normalization.cpp
Result<NodeLowering> lowerSoftmax(const Node& n, const LoweringContext& ctx);         // normalization.cpp
Result<NodeLowering> lowerSoftmaxGrad(const Node& n, const LoweringContext& ctx);     // normalization.cpp
Result<NodeLowering> lowerCrossEntropy(const Node& n, const LoweringContext& ctx);    // loss.cpp
Result<NodeLowering> lowerCrossEntropyGrad(const Node& n, const LoweringContext& ctx);
Result<NodeLowering> lowerCrossEntropyWithGrad(const Node& n, const LoweringContext& ctx);
// loss_resident.cpp: the kernel those two take where it applies (residentXentGrad: LoweringContext::xentOnePass,
// 16-bit logits with V % 8 == 0, two rows fit in shared memory).
bool residentXentGrad(const Node& n, const LoweringContext& ctx, bool withLoss);
Result<NodeLowering> lowerXentGradResident(const Node& n, const LoweringContext& ctx, bool withLoss);
Result<NodeLowering> lowerVocabMax(const Node& n, const LoweringContext& ctx);
Result<NodeLowering> lowerVocabSumExp(const Node& n, const LoweringContext& ctx);
Result<NodeLowering> lowerVocabPick(const Node& n, const LoweringContext& ctx);
Result<NodeLowering> lowerVocabLoss(const Node& n, const LoweringContext& ctx);
Result<NodeLowering> lowerVocabXentGrad(const Node& n, const LoweringContext& ctx);
Result<NodeLowering> lowerEmbedding(const Node& n, const LoweringContext& ctx);       // gather.cpp
Result<NodeLowering> lowerEmbeddingGrad(const Node& n, const LoweringContext& ctx);
Result<NodeLowering> lowerReduce(const Node& n, const LoweringContext& ctx);          // reduction.cpp (sum, mean, max)
Result<NodeLowering> lowerSumSquares(const Node& n, const LoweringContext& ctx);      // reduction.cpp (sum_squares, global_norm)
Result<NodeLowering> lowerAdamWUpdate(const Node& n, const LoweringContext& ctx);     // optimizer.cpp
// A group of adamw_update nodes as one multi-tensor kernel (runtime/cuda/adamw_groups.h: its layout and gates).
Result<NodeLowering> lowerAdamWGroup(const FusionGroup& g, const LoweringContext& ctx);
Result<NodeLowering> lowerClipScale(const Node& n, const LoweringContext& ctx);
// A group of casts of parameters and inputs as one multi-tensor kernel (runtime/cuda/cast_groups.h: its layout)
// of at most `maxBlocks` blocks striding over the tensors' chunks (tests lower it with fewer).
Result<NodeLowering> lowerCastGroup(const FusionGroup& g, const LoweringContext& ctx, int64_t maxBlocks = 2048,
                                    const std::vector<bool>& kept = {});  // multi_tensor.cpp

// gemm_sm90.cpp: a matmul_epilogue {epilogue=gelu_bias, bias (with a residual or not), dgelu, dgelu_bgrad or
// bgrad_a} as our Hopper GEMM kernel (TMA loads, wgmma, TMA stores; dgelu_bgrad and bgrad_a then a column-sum
// kernel) where ownGemm accepts it (sm_90, bf16, the tile multiples; LoweringContext::ownGeluGemm, ownBiasGemm,
// ownBiasResidualGemm, ownDgeluGemm, ownDgeluBgradGemm, ownBgradAGemm); else cuBLASLt (bgrad_a: never folded then).
bool ownGemm(const Node& n, const LoweringContext& ctx);
// Which kinds it takes (CudaOptions::ownGemm, TPC_OWN_GEMM): "" or "0" none, else a comma list of "1" or "all"
// (every kind), gelu_bias, bias, bias_residual, dgelu, dgelu_bgrad, bgrad_a, "multicast" (ownGemmMulticast: in clusters of two blocks
// sharing b's tiles) and "pre1" (ownGemmPreAhead 1: dgelu's pre copied one chunk ahead, the earlier scheme, for
// measuring).
// Errors name `from` (the setting) and the kind that is not one.
Status setOwnGemmKinds(const std::string& kinds, const char* from, LoweringContext* ctx);
Result<NodeLowering> lowerGemm(const Node& n, const LoweringContext& ctx);
// The part of lowerGemm's kernel source that holds every PTX instruction it uses, as functions (the CPU emulator of
// tests/unit/sm90_emulator.h puts its own in its place).
const char* gemmSm90Ptx();

}  // namespace tpc::cuda
