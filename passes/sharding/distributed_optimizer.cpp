// ZeRO-1 (Megatron's --use-distributed-optimizer), the data-parallel policy's `zero1=true`: each AdamW
// moment is split over dp on a dim its param is not split on, and the param's gradient is hinted to the same
// placement. The rules then do the rest: the gradient is reduce-scattered instead of all-reduced, global_norm
// sums squares per slice, adamw_update runs on the dp slice (of a replicated param: a free local slice), and
// the updated param, whose output keeps the param's placement, is all-gathered over dp.
#include "passes/sharding/sharding.h"

namespace tpc {
namespace {

const char* kPolicy = "data-parallel(zero1)";

// The first dim of `p` that no mesh axis splits and that `dp` divides; -1 if none.
int64_t zeroDim(const Value* p, int64_t dp) {
  for (int64_t d = 0; d < p->type().rank(); ++d) {
    bool split = false;
    if (p->placement())
      for (const auto& [axis, ap] : p->placement()->axes) split |= ap.isS() && ap.dim == d;
    if (!split && p->shape()[d] % dp == 0) return d;
  }
  return -1;
}

// The gradient AdamW reads, before global-norm clipping scaled it: where it must be reduce-scattered so that
// global_norm and the clipping already see one slice per rank.
Value* unclippedGrad(Value* g) {
  Node* n = g->def();
  if (!n || n->op() != OpKind::Mul) return g;
  Node* s = n->operand(1)->def();
  if (s && s->op() == OpKind::Cast) s = s->operand(0)->def();  // the clip scale cast to a low-precision grad
  return s && s->op() == OpKind::ClipScale ? n->operand(0) : g;
}

Status hint(Value* v, const Value* param, int64_t d) {
  if (param->placement())
    for (const auto& [axis, ap] : param->placement()->axes)
      if (axis != "dp") TPC_TRY(annotatePlacement(v, axis, ap, kPolicy));
  return annotatePlacement(v, "dp", AxisPlacement::split(d), kPolicy);
}

}  // namespace

Result<std::vector<std::string>> shardOptimizerStateOverDp(Graph& g, int64_t dp) {
  std::vector<std::string> replicated;
  for (Node* n : g.nodes()) {
    if (n->op() != OpKind::AdamWUpdate) continue;
    Value* p = n->operand(0);
    Value* m = n->operand(2);
    Value* v = n->operand(3);
    if (m->def() || v->def())
      return makeError(kPolicy, ": the AdamW moments of ", p->name(), " are not parameters of the step");
    int64_t d = zeroDim(p, dp);
    if (d < 0) {  // e.g. a 1-D bias that tp already splits: its (small) moments stay replicated over dp
      replicated.push_back(p->name());
      continue;
    }
    TPC_TRY(hint(m, p, d));
    TPC_TRY(hint(v, p, d));
    TPC_TRY(hint(unclippedGrad(n->operand(1)), p, d));
  }
  return replicated;
}

}  // namespace tpc
