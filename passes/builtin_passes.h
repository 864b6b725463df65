// Factories of tpc's own passes; each pass's class stays private to its file (STYLE.md: MLIR layout).
#pragma once

#include <functional>
#include <memory>

#include "passes/pass.h"

namespace tpc {

std::unique_ptr<Pass> createCSEPass();  // cse.cpp
std::unique_ptr<Pass> createDCEPass();  // dce.cpp
std::unique_ptr<Pass> createInferencePass();  // inference.cpp: dropout off, for evaluation and sampling
// cross_entropy(slice(logits)) -> cross_entropy(logits){num_classes}, and its gradient without the concat.
std::unique_ptr<Pass> createFoldVocabPaddingPass();  // fold_vocab_padding.cpp
// The fold itself (the partition engine runs it too); returns whether anything was folded.
Result<bool> foldPaddedVocabSlices(Graph& g);
// cross_entropy + cross_entropy_grad of the same logits => cross_entropy_with_grad (one rank's program, before fuse).
std::unique_ptr<Pass> createFuseClassifierPass();  // fuse_classifier.cpp
// Groups elementwise chains into fusion groups (fusion_group=N) for the CUDA backend; runs last.
std::unique_ptr<Pass> createFusePass();  // fusion.cpp
// accum, clip-grad, beta1, beta2, eps, weight-decay, loss: TrainingStepOptions (autodiff.h).
Result<std::unique_ptr<Pass>> createAutodiffPass(const PassOptions& options);  // autodiff.cpp
// dtype=bf16|f16: the forward graph computes in that type, parameters stay f32 (before autodiff).
Result<std::unique_ptr<Pass>> createMixedPrecisionPass(const PassOptions& options);  // mixed_precision.cpp
// mode=full|selective: activation recomputation of the training step (after autodiff, cse, dce).
Result<std::unique_ptr<Pass>> createRecomputePass(const PassOptions& options);  // recompute.cpp
// reduce_sum(matmul(a, d, transpose_a), batch axes) => one matmul over the flattened rows (one rank's program).
std::unique_ptr<Pass> createFoldBatchMatmulSumPass();  // fold_batch_matmul_sum.cpp
std::unique_ptr<Pass> createFoldLayerNormGradResidualPass();  // fold_layer_norm_grad_residual.cpp
// layer_norm(add(t, r)) (or of a bias GEMM with the residual r as C) => layer_norm(t, gamma, beta, r) writing the
// sum too (one rank's program, after fold-matmul-epilogues). `accept` may refuse a layer_norm, `acceptGemm` the bias
// GEMM without its residual; empty: all taken.
std::unique_ptr<Pass> createFoldLayerNormResidualPass(std::function<bool(const Node&)> accept = {},
                                                      std::function<bool(const Node&)> acceptGemm = {});  // fold_layer_norm_residual.cpp
// reduce_sum(dx) over the leading dims after a layer_norm_grad => its sum_dx result (one rank's program). `canSum`
// may refuse a layer_norm_grad (the CUDA backend: only its block kernel sums dx); empty: all are taken.
std::unique_ptr<Pass> createFoldLayerNormGradBiasSumPass(std::function<bool(const Node&)> canSum = {});  // fold_layer_norm_grad_bias_sum.cpp
// attention(reshape(slice(transpose(qkv)))) and its gradient => attention_qkv(qkv) (one rank's program).
std::unique_ptr<Pass> createPackQkvAttentionPass();  // pack_qkv_attention.cpp
// Bias, gelu, their gradients and residual adds around a matmul => matmul_epilogue nodes (one rank's program,
// after fuse). `canRun` may refuse a candidate node (the CUDA backend asks cuBLASLt); empty: all are taken.
std::unique_ptr<Pass> createFoldMatmulEpiloguesPass(std::function<bool(const Node&)> canRun = {});  // fold_matmul_epilogues.cpp
// global_norm(cast(g: bf16|f16) {to=f32}) => global_norm(g): the same norm without the f32 copy.
std::unique_ptr<Pass> createGlobalNormSkipCastsPass();  // global_norm_skip_casts.cpp
// Each collective just after its operand's producer (one rank's program; overlap on a communication stream).
std::unique_ptr<Pass> createHoistCollectivesPass();  // hoist_collectives.cpp
// Sharding (passes/sharding/): policies that annotate, and the engine's propagation / partition.
Result<std::unique_ptr<Pass>> createMegatronTpPass(const PassOptions& options);    // megatron_tp.cpp
Result<std::unique_ptr<Pass>> createDataParallelPass(const PassOptions& options);  // data_parallel.cpp
std::unique_ptr<Pass> createSequenceParallelPass();                                // data_parallel.cpp
Result<std::unique_ptr<Pass>> createPartitionPass(const PassOptions& options);     // data_parallel.cpp
std::unique_ptr<Pass> createShardingPropagatePass();                               // data_parallel.cpp

}  // namespace tpc
