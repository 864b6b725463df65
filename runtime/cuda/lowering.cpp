// Dispatch: kernel families first (attention, normalization, loss, gather, reductions, optimizer), then
// the generated lowerings (elementwise, movement, constants), by op traits.
#include "runtime/cuda/lowering.h"

#include "ir/fusion_group.h"
#include "passes/builtin_passes.h"
#include "runtime/cuda/kernels/family_lowerings.h"
#include "runtime/cuda/kernels/generated_lowerings.h"

namespace tpc::cuda {

bool isView(const Node& n) {
  if (!n.has(traits::Movement) || n.numOperands() != 1) return false;
  const Shape& in = n.operand(0)->shape();
  switch (n.op()) {
    case OpKind::Reshape: return true;  // every value is contiguous and row-major
    case OpKind::Transpose: {
      const auto& perm = n.getInts("perm");
      int64_t last = -1;  // the dims of size > 1 must keep their order
      for (int64_t p : perm) {
        if (in[p] == 1) continue;
        if (p < last) return false;
        last = p;
      }
      return true;
    }
    case OpKind::Slice: {
      int64_t axis = n.getInt("axis");
      if (axis < 0) axis += static_cast<int64_t>(in.size());
      for (int64_t k = 0; k < axis; ++k)
        if (in[k] != 1) return false;
      return n.getInt("start") == 0;
    }
    case OpKind::Concat: return true;  // of one operand
    case OpKind::BroadcastTo: return n.result()->type().numel() == n.operand(0)->type().numel();
    default: return false;
  }
}

NodeExec nodeExec(const Node& n) {
  if (n.op() == OpKind::Matmul || n.op() == OpKind::MatmulEpilogue) return NodeExec::Matmul;
  if (isView(n)) return NodeExec::View;
  if (n.has(traits::Collective) && n.graph() && n.graph()->mesh().axisSize(n.getStr("axis")) > 1) return NodeExec::Collective;
  return NodeExec::Kernels;
}

Status rewriteForCuda(Graph& g, const std::function<bool(const Node&)>& canRunEpilogue, bool foldLayerNormGradResidual,
                      const std::function<bool(const Node&)>& canSumLayerNormGradDx,
                      const std::function<bool(const Node&)>& canAddLayerNormResidual) {
  // Attention on the QKV projection's layout: no copies of q, k, v, out and their gradients. Its pattern lies
  // between the QKV projection and attention (it takes the projection's output as it is), so either order
  // with the epilogue fold fires both on GPT steps (test_rewrite_for_cuda.cpp); first, so that it sees the
  // fuse pass's fusion groups as they are (the fold ungroups singletons) and the fold sees dqkv as one
  // attention_qkv_grad result, whose bias sum and input gradient become one bgrad_a (or with the weight gradient
  // one bgrad_b, where bgrad_a is refused).
  TPC_TRY(createPackQkvAttentionPass()->run(g));
  // Weight gradients as one matmul over all rows: no [B, K, N] intermediate, f32 accumulation over the batch.
  TPC_TRY(createFoldBatchMatmulSumPass()->run(g));
  // Bias, gelu, residual adds and bias gradients into cuBLASLt epilogues, where cuBLASLt has an algorithm.
  if (canRunEpilogue) TPC_TRY(createFoldMatmulEpiloguesPass(canRunEpilogue)->run(g));
  // The backward residual stream's add(r, dx) into the layer_norm_grad kernel: dx is never stored alone.
  if (foldLayerNormGradResidual) TPC_TRY(createFoldLayerNormGradResidualPass()->run(g));
  // Bias gradients summed off the residual stream by the layer_norm_grad kernel that writes it (after the
  // residual fold: the sum is of dx + residual, as the reduce_sum read it).
  if (canSumLayerNormGradDx) TPC_TRY(createFoldLayerNormGradBiasSumPass(canSumLayerNormGradDx)->run(g));
  // The forward residual stream's adds into the layer_norms that read them (after the epilogue fold: a bias GEMM
  // that took the residual as C gives it back).
  if (canAddLayerNormResidual) TPC_TRY(createFoldLayerNormResidualPass(canAddLayerNormResidual, canRunEpilogue)->run(g));
  // The norm reads bf16 gradients: their f32 casts fold into the AdamW kernel with the clip (adamw_groups.h).
  TPC_TRY(createGlobalNormSkipCastsPass()->run(g));
  return {};
}

bool residualStreamGradient(const Value* d) {
  while (d->def() && d->def()->op() == OpKind::Reshape) d = d->def()->operand(0);
  return d->def() && (d->def()->op() == OpKind::Add || d->def()->op() == OpKind::LayerNormGrad);
}

Result<NodeLowering> lowerNode(const Node& n, const LoweringContext& ctx) {
  if (const FamilyLowering* f = findFamilyLowering(n.op())) return (*f)(n, ctx);
  if (n.has(traits::Collective)) return lowerSingleRankCollective(n, ctx);
  if (n.has(traits::Elementwise)) {
    // Alone, as a one-member fusion group when that takes the 16-byte vector path (the same arithmetic and
    // rounding as lowerElementwise's scalar kernel, eight bf16 elements a load): gelu_grad, residual adds.
    if (ctx.vectorElementwise && n.numResults() == 1) {
      FusionGroup fg;
      fg.members = {const_cast<Node*>(&n)};
      for (Value* v : n.operands()) fg.inputs.push_back(v);  // operand k is input k (duplicates kept)
      fg.outputs = {n.result()};
      fg.shape = n.result()->shape();
      auto l = lowerFusionGroup(fg, ctx);
      if (l.ok() && l->kernels.size() == 1 && l->kernels[0].entry.rfind("tpc_fused_v", 0) == 0) return l;
    }
    return lowerElementwise(n, ctx);
  }
  if (n.has(traits::Movement)) return lowerMovement(n, ctx);
  if (n.op() == OpKind::Full) return lowerFull(n, ctx);
  return makeError("cuda: no lowering for op ", n.opName(), " (add one to runtime/cuda/kernels)");
}

}  // namespace tpc::cuda
