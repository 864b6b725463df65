// Grouping the casts of parameters and inputs (cast_groups.h).
#include "runtime/cuda/cast_groups.h"

#include <utility>

#include "runtime/cuda/ordered_buckets.h"

namespace tpc::cuda {

bool isCastGroup(const FusionGroup& g) {
  return g.id < 0 && g.members.size() == 1 && g.members.front()->op() == OpKind::Cast;
}

std::vector<FusionGroup> castGroups(const Graph& g, const llvm::DenseMap<const Node*, const FusionGroup*>* grouped) {
  auto floating = [](DType t) { return t == DType::f32 || t == DType::bf16 || t == DType::f16; };
  OrderedBuckets<std::pair<DType, DType>> buckets;
  for (Node* n : g.nodes()) {
    if (n->op() != OpKind::Cast || fusionGroupOf(*n) >= 0 || (grouped && grouped->lookup(n))) continue;
    const Value* x = n->operand(0);
    DType from = x->dtype(), to = n->result()->dtype();
    if ((x->isParam() || x->isInput()) && floating(from) && floating(to) && from != to) buckets.add({from, to}, n);
  }
  std::vector<FusionGroup> groups;
  for (std::vector<Node*>& casts : buckets.buckets()) {
    if (casts.size() < 2) continue;
    FusionGroup fg;
    fg.members = {casts.front()};
    fg.absorbed.assign(casts.begin() + 1, casts.end());
    for (Node* n : casts) {
      fg.inputs.push_back(n->operand(0));
      fg.outputs.push_back(n->result());
    }
    fg.shape = casts.front()->result()->shape();
    groups.push_back(std::move(fg));
  }
  return groups;
}

}  // namespace tpc::cuda
