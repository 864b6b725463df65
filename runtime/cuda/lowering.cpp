// Dispatch: kernel families first (attention, normalization, loss, gather, reductions, optimizer), then
// the generated lowerings (elementwise, movement, constants), by op traits.
#include "runtime/cuda/lowering.h"

#include "passes/builtin_passes.h"
#include "runtime/cuda/kernels/family_lowerings.h"
#include "runtime/cuda/kernels/generated_lowerings.h"

namespace tpc::cuda {

NodeExec nodeExec(const Node& n) {
  if (n.op() == OpKind::Matmul) return NodeExec::Matmul;
  if (n.has(traits::Collective) && n.graph() && n.graph()->mesh().axisSize(n.getStr("axis")) > 1) return NodeExec::Collective;
  return NodeExec::Kernels;
}

Status rewriteForCuda(Graph& g) {
  // Weight gradients as one matmul over all rows: no [B, K, N] intermediate, f32 accumulation over the batch.
  TPC_TRY(createFoldBatchMatmulSumPass()->run(g));
  return {};
}

Result<NodeLowering> lowerNode(const Node& n, const LoweringContext& ctx) {
  if (const FamilyLowering* f = findFamilyLowering(n.op())) return (*f)(n, ctx);
  if (n.has(traits::Collective)) return lowerSingleRankCollective(n, ctx);
  if (n.has(traits::Elementwise)) return lowerElementwise(n, ctx);
  if (n.has(traits::Movement)) return lowerMovement(n, ctx);
  if (n.op() == OpKind::Full) return lowerFull(n, ctx);
  return makeError("cuda: no lowering for op ", n.opName(), " (add one to runtime/cuda/kernels)");
}

}  // namespace tpc::cuda
