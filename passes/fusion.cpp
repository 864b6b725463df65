// The fuse pass: groups connected elementwise nodes over one index space into fusion groups (attribute
// fusion_group=N on each member, ir/fusion_group.h), which the CUDA backend runs as one kernel keeping the
// values read only inside the group in registers. Runs last (after partition); the CPU backend ignores it.
//   %a = add(%mm, %bias); %b = gelu(%a)  =>  both {fusion_group=0}: one kernel, %a never stored
// Rules, tried in program order on each elementwise node n:
//   - n joins the groups of its operands' producers whose index space is n's result shape (merging them);
//   - a group is joined only if no node outside it reads a member's result before n (the fused kernel runs
//     at its last member, so such a reader would see nothing yet); other producers are left alone;
//   - a group never spans a non-elementwise op: members are linked only through member-to-member operands;
//   - n joins a group whose last member lies more than kMaxSpan non-elementwise nodes before it only if the
//     group's inputs are smaller than the value n reads from it: the members move to the group's end, so
//     their inputs stay live over that stretch instead of that value (joined always, gradient accumulation's
//     sums would hold every micro-batch's gradients until the last micro-batch; the tied embedding's bf16
//     head gradient, cast to f32 at the backward's end, is still fused).
// Members are then moved next to the group's last member, so that a printed group reads as one block. A graph
// that already has fusion groups is left unchanged.
#include <algorithm>
#include <map>

#include "ir/fusion_group.h"
#include "passes/builtin_passes.h"
#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/DenseSet.h"

namespace tpc {
namespace {

class FusePass final : public Pass {
 public:
  std::string_view name() const override { return "fuse"; }

  Result<bool> run(Graph& g) override {
    bool changed = false;
    std::vector<Node*> nodes = g.nodeVector();
    // A graph that already has groups (fused before, or written by hand) is left as it is.
    for (Node* n : nodes)
      if (fusionGroupOf(*n) >= 0) return false;
    llvm::DenseMap<const Node*, size_t> pos;
    for (size_t k = 0; k < nodes.size(); ++k) pos[nodes[k]] = k;
    // heavyBefore[k]: the non-elementwise nodes among nodes[0..k).
    std::vector<size_t> heavyBefore(nodes.size() + 1, 0);
    for (size_t k = 0; k < nodes.size(); ++k) heavyBefore[k + 1] = heavyBefore[k] + !nodes[k]->has(traits::Elementwise);
    auto users = g.computeUsers();
    // Group id per elementwise node; groups[id] its members (empty once merged into another), lastOf[id] the
    // position of its last member.
    llvm::DenseMap<const Node*, size_t> groupOf;
    std::vector<std::vector<Node*>> groups;
    std::vector<size_t> lastOf;
    // The bytes of the values group `id` reads from outside it (inputs and parameters aside: they are live
    // anyway).
    auto inputBytes = [&](size_t id) {
      llvm::DenseSet<const Value*> seen;
      int64_t bytes = 0;
      for (const Node* m : groups[id])
        for (const Value* v : m->operands()) {
          auto it = v->def() ? groupOf.find(v->def()) : groupOf.end();
          bool inside = it != groupOf.end() && it->second == id;
          if (v->def() && !inside && seen.insert(v).second) bytes += v->type().bytes();
        }
      return bytes;
    };
    for (Node* n : nodes) {
      if (!n->has(traits::Elementwise)) continue;
      std::vector<size_t> joined;
      for (Value* v : n->operands()) {
        Node* d = v->def();
        if (!d || !groupOf.count(d)) continue;
        size_t id = groupOf[d];
        if (std::find(joined.begin(), joined.end(), id) != joined.end()) continue;
        if (d->result()->shape() != n->result()->shape()) continue;  // a broadcast operand: read from memory
        if (heavyBefore[pos[n]] - heavyBefore[lastOf[id] + 1] > kMaxSpan && inputBytes(id) >= v->type().bytes())
          continue;  // too far back, and holding its inputs costs more than holding v: left alone
        joined.push_back(id);
        if (!readersComeLater(groups, joined, n, pos, users)) joined.pop_back();
      }
      size_t id = joined.empty() ? groups.size() : joined.front();
      if (joined.empty()) groups.emplace_back(), lastOf.emplace_back();
      for (size_t k = 1; k < joined.size(); ++k) {
        for (Node* m : groups[joined[k]]) groupOf[m] = id;
        groups[id].insert(groups[id].end(), groups[joined[k]].begin(), groups[joined[k]].end());
        groups[joined[k]].clear();
      }
      groups[id].push_back(n);
      groupOf[n] = id;
      lastOf[id] = pos[n];  // every member so far comes before n
    }
    // Number the groups of two or more members by their last member; move members next to it.
    std::vector<std::vector<Node*>> fused;
    for (auto& m : groups)
      if (m.size() >= 2) {
        std::sort(m.begin(), m.end(), [&](const Node* a, const Node* b) { return pos[a] < pos[b]; });
        fused.push_back(m);
      }
    std::sort(fused.begin(), fused.end(), [&](const auto& a, const auto& b) { return pos[a.back()] < pos[b.back()]; });
    for (size_t id = 0; id < fused.size(); ++id) {
      for (Node* m : fused[id]) {
        m->setAttr("fusion_group", Attr(static_cast<int64_t>(id)));
        if (m != fused[id].back()) g.move(m, fused[id].back());
      }
      changed = true;
    }
    return changed;
  }

 private:
  // The most non-elementwise nodes a group may reach across to a new member (a transformer layer's backward
  // has about a dozen; a micro-batch's forward and backward hundreds).
  static constexpr size_t kMaxSpan = 32;

  // Whether every node outside the union of `ids` (and n) that reads a member's result comes after n.
  static bool readersComeLater(const std::vector<std::vector<Node*>>& groups, const std::vector<size_t>& ids, const Node* n,
                               const llvm::DenseMap<const Node*, size_t>& pos,
                               const llvm::DenseMap<const Value*, llvm::SmallVector<Node*, 4>>& users) {
    auto inUnion = [&](const Node* u) {
      if (u == n) return true;
      for (size_t id : ids)
        if (std::find(groups[id].begin(), groups[id].end(), u) != groups[id].end()) return true;
      return false;
    };
    size_t at = pos.lookup(n);
    for (size_t id : ids)
      for (const Node* m : groups[id])
        for (const Node* u : users.lookup(m->result()))
          if (!inUnion(u) && pos.lookup(u) < at) return false;
    return true;
  }
};

}  // namespace

std::unique_ptr<Pass> createFusePass() { return std::make_unique<FusePass>(); }

}  // namespace tpc
