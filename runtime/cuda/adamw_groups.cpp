// Grouping the adamw_update nodes of a step (adamw_groups.h).
#include "runtime/cuda/adamw_groups.h"

#include <functional>
#include <map>
#include <tuple>

#include "runtime/backend.h"
#include "runtime/cuda/lowering.h"

namespace tpc::cuda {

bool isAdamWGroup(const FusionGroup& g) { return !g.members.empty() && g.members.front()->op() == OpKind::AdamWUpdate; }

size_t adamwGroupGates(const FusionGroup& g) { return g.inputs.size() - 4 * g.members.size() - 2; }

std::vector<FusionGroup> adamwGroups(const Graph& g, const llvm::DenseMap<const Node*, const FusionGroup*>* fused) {
  std::vector<Node*> nodes = g.nodeVector();
  llvm::DenseMap<const Node*, int> index;
  for (int k = 0; k < static_cast<int>(nodes.size()); ++k) index[nodes[k]] = k;
  // The node position after which a value is in memory (-1: a parameter or an input).
  std::function<int(const Value*)> ready = [&](const Value* v) -> int {
    const Node* d = v->def();
    if (!d) return -1;
    if (nodeExec(*d) == NodeExec::View) return ready(d->operand(0));
    const FusionGroup* fg = fused ? fused->lookup(d) : nullptr;
    return index.lookup(fg ? fg->members.back() : d);
  };
  std::vector<Value*> gates;
  for (const char* name : {kLossOutput, kGradNormOutput})
    for (size_t i = 0; i < g.outputs().size(); ++i)
      if (g.outputName(i) == name) gates.push_back(g.outputs()[i].value);
  auto users = g.computeUsers();
  using Key = std::tuple<std::vector<DType>, double, double, double, const Value*, const Value*>;
  std::map<Key, std::vector<Node*>> buckets;
  std::vector<Key> order;
  for (Node* n : nodes) {
    if (n->op() != OpKind::AdamWUpdate) continue;
    bool read = false;
    for (Value* r : n->results()) read |= users.count(r) && !users.find(r)->second.empty();
    if (read) continue;
    std::vector<DType> dtypes;
    for (unsigned k = 0; k < 4; ++k) dtypes.push_back(n->operand(k)->dtype());
    for (Value* r : n->results()) dtypes.push_back(r->dtype());
    Key key{dtypes, n->getFloat("beta1"), n->getFloat("beta2"), n->getFloat("eps"), n->operand(4), n->operand(5)};
    if (!buckets.count(key)) order.push_back(key);
    buckets[key].push_back(n);
  }
  std::vector<FusionGroup> groups;
  for (const Key& key : order) {
    std::vector<Node*>& members = buckets[key];
    int at = index.lookup(members.back());
    bool gated = true;
    for (Value* v : gates) {
      DType t = v->dtype();
      gated &= ready(v) < at && (t == DType::f32 || t == DType::bf16 || t == DType::f16);  // what the kernel reads
    }
    if (!gated) continue;
    FusionGroup fg;
    fg.members = members;
    for (Node* n : members) {
      for (unsigned k = 0; k < 4; ++k) fg.inputs.push_back(n->operand(k));
      for (Value* r : n->results()) fg.outputs.push_back(r);
    }
    fg.inputs.push_back(members.front()->operand(4));
    fg.inputs.push_back(members.front()->operand(5));
    fg.inputs.insert(fg.inputs.end(), gates.begin(), gates.end());
    groups.push_back(std::move(fg));
  }
  return groups;
}

}  // namespace tpc::cuda
