// Collecting and checking the fusion groups of a graph.
#include "ir/fusion_group.h"

#include <algorithm>
#include <map>

#include "llvm/ADT/SmallPtrSet.h"

namespace tpc {

int64_t fusionGroupOf(const Node& n) {
  if (!n.has(traits::Elementwise)) return -1;
  const Attr* a = n.attrs().find("fusion_group");
  return a && a->kind() == AttrKind::Int ? a->i() : -1;
}

bool FusionGroup::isInternal(const Value* v) const {
  const Node* d = v->def();
  if (!d || (std::find(members.begin(), members.end(), d) == members.end() &&
             std::find(absorbed.begin(), absorbed.end(), d) == absorbed.end()))
    return false;
  return std::find(outputs.begin(), outputs.end(), v) == outputs.end();
}

Result<std::vector<FusionGroup>> fusionGroups(const Graph& g) {
  std::map<int64_t, FusionGroup> byId;
  std::vector<Node*> nodes = g.nodeVector();
  llvm::DenseMap<const Node*, size_t> pos;
  for (size_t k = 0; k < nodes.size(); ++k) pos[nodes[k]] = k;
  for (Node* n : nodes) {
    const Attr* a = n->attrs().find("fusion_group");
    if (!a || a->i() < 0) continue;
    FusionGroup& fg = byId[a->i()];
    if (fg.members.empty()) {
      fg.id = a->i();
      fg.shape = n->result()->shape();
    }
    if (n->result()->shape() != fg.shape)
      return makeError("fusion_group=", fg.id, ": ", n->opName(), " gives ", n->result()->type().str(),
                       " but the group's index space is ", shapeStr(fg.shape), " (members must have one result shape)");
    fg.members.push_back(n);
  }
  auto users = g.computeUsers();
  std::vector<FusionGroup> out;
  for (auto& [id, fg] : byId) {
    llvm::SmallPtrSet<const Node*, 16> member(fg.members.begin(), fg.members.end());
    size_t last = pos[fg.members.back()];
    for (Node* n : fg.members)
      for (Value* v : n->operands())
        if (!(v->def() && member.count(v->def())) && std::find(fg.inputs.begin(), fg.inputs.end(), v) == fg.inputs.end())
          fg.inputs.push_back(v);
    for (Node* n : fg.members) {
      Value* r = n->result();
      bool external = g.isOutput(r);
      for (Node* u : users.lookup(r)) {
        if (member.count(u)) continue;
        external = true;
        if (pos[u] < last)
          return makeError("fusion_group=", id, ": ", u->opName(), " reads the result of member ", n->opName(),
                           " before the group's last member ", fg.members.back()->opName(),
                           " (the fused kernel runs there): split the group or move the reader after it");
      }
      if (external) fg.outputs.push_back(r);
    }
    out.push_back(std::move(fg));
  }
  std::sort(out.begin(), out.end(), [&](const FusionGroup& a, const FusionGroup& b) {
    return pos[a.members.back()] < pos[b.members.back()];
  });
  return out;
}

}  // namespace tpc
