// planMemory: largest first, lowest fitting offset among the already placed buffers that overlap in time.
// planStepMemory: lifetimes from the graph's uses (a view's uses count for the value it aliases).
#include "runtime/memory_plan.h"

#include <algorithm>
#include <map>
#include <numeric>

#include "ir/assert.h"

namespace tpc {

namespace {

// The placed buffers, found by the lifetimes they overlap without a scan of them all: a step unrolled over many
// micro-batches has tens of thousands of buffers, each overlapping a few hundred. A lifetime [s, e] overlaps
// [a, b] when it holds a (a segment tree over time keeps each buffer at the O(log T) nodes covering its
// lifetime; the walk to leaf a meets exactly those holding a) or when it starts in (a, b] (ordered by start).
class PlacedLifetimes {
 public:
  PlacedLifetimes(int lo, int hi) : lo_(lo), n_(hi - lo + 1), tree_(4 * static_cast<size_t>(n_)) {}
  void add(int first, int last, size_t id) {
    insert(1, 0, n_ - 1, first - lo_, last - lo_, id);
    byStart_.emplace(first, id);
  }
  template <typename F>
  void forEachOverlapping(int a, int b, F&& f) const {
    for (int node = 1, l = 0, r = n_ - 1, x = a - lo_;;) {
      for (size_t id : tree_[node]) f(id);
      if (l == r) break;
      const int m = l + (r - l) / 2;
      if (x <= m) node = 2 * node, r = m;
      else node = 2 * node + 1, l = m + 1;
    }
    for (auto it = byStart_.upper_bound(a); it != byStart_.end() && it->first <= b; ++it) f(it->second);
  }

 private:
  void insert(int node, int l, int r, int s, int e, size_t id) {
    if (e < l || r < s) return;
    if (s <= l && r <= e) {
      tree_[node].push_back(id);
      return;
    }
    const int m = l + (r - l) / 2;
    insert(2 * node, l, m, s, e, id);
    insert(2 * node + 1, m + 1, r, s, e, id);
  }
  int lo_, n_;
  std::vector<std::vector<size_t>> tree_;
  std::multimap<int, size_t> byStart_;
};

}  // namespace

int64_t planMemory(std::vector<PlannedBuffer>& buffers, int64_t alignment) {
  std::vector<size_t> order(buffers.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return buffers[a].bytes > buffers[b].bytes; });
  auto align = [&](int64_t v) { return (v + alignment - 1) / alignment * alignment; };
  if (buffers.empty()) return 0;
  int lo = buffers[0].first, hi = buffers[0].last;
  for (const PlannedBuffer& b : buffers) {
    TPC_ASSERT(b.first <= b.last, "planMemory: a buffer's lifetime ends before it starts");
    lo = std::min(lo, b.first);
    hi = std::max(hi, b.last);
  }
  PlacedLifetimes placed(lo, hi);
  int64_t peak = 0;
  std::vector<std::pair<int64_t, int64_t>> busy;  // [begin, end) of overlapping placed buffers
  for (size_t i : order) {
    PlannedBuffer& b = buffers[i];
    int64_t size = align(std::max<int64_t>(b.bytes, 1));
    busy.clear();
    placed.forEachOverlapping(b.first, b.last, [&](size_t j) {
      const PlannedBuffer& o = buffers[j];
      busy.push_back({o.offset, o.offset + align(std::max<int64_t>(o.bytes, 1))});
    });
    std::sort(busy.begin(), busy.end());
    int64_t at = 0;
    for (auto [s, e] : busy) {
      if (at + size <= s) break;
      at = std::max(at, e);
    }
    b.offset = at;
    peak = std::max(peak, at + size);
    placed.add(b.first, b.last, i);
  }
  return peak;
}

StepMemoryPlan planStepMemory(const Graph& g, llvm::ArrayRef<int64_t> workspaceBytes,
                              const llvm::DenseMap<const Node*, const FusionGroup*>* groupOf,
                              llvm::function_ref<bool(const Node&)> isView, int64_t alignment,
                              llvm::function_ref<bool(const Node&)> onCommStream,
                              llvm::function_ref<bool(const Value*)> external) {
  StepMemoryPlan plan;
  auto isExternal = [external](const Value* v) { return external && external(v); };
  std::vector<Node*> nodes = g.nodeVector();
  const int end = static_cast<int>(nodes.size());
  llvm::DenseMap<const Node*, int> index;
  for (int k = 0; k < end; ++k) index[nodes[k]] = k;
  // Where each node's work happens: a fusion group's members all run at its last member.
  std::vector<int> at(nodes.size());
  for (int k = 0; k < end; ++k) {
    const FusionGroup* fg = (groupOf ? groupOf->lookup(nodes[k]) : nullptr);
    at[k] = fg ? index[fg->members.back()] : k;
  }
  // A view's memory is its operand's: follow chains of views to the value that owns the bytes.
  auto root = [&](const Value* v) {
    auto it = plan.viewOf.find(v);
    return it == plan.viewOf.end() ? v : it->second;
  };
  for (Node* n : nodes)
    if (isView(*n)) plan.viewOf[n->result()] = root(n->operand(0));
  llvm::DenseMap<const Value*, int> lastUse;  // of the memory: by the value or any view of it
  for (int k = 0; k < end; ++k)
    for (const Value* v : nodes[k]->operands()) lastUse[root(v)] = std::max(lastUse.lookup(root(v)), at[k]);
  // Outputs are read after the last node, before any parameter copy (the old value of a parameter that is
  // also returned as itself, or through a view, must survive the step).
  for (const GraphOutput& o : g.outputs()) lastUse[root(o.value)] = end;
  std::map<std::string, const Value*> params;
  for (const Value* p : g.params()) params[p->name()] = p;
  for (size_t i = 0; i < g.outputs().size(); ++i) {
    auto it = params.find(g.outputName(i));
    if (it == params.end()) continue;
    const Value *v = g.outputs()[i].value, *p = it->second;
    if (root(v) == p) continue;  // the parameter itself, or a view of it: nothing to write
    // The node may read the old parameter only at the same element it writes: elementwise-like ops do.
    bool safe = !plan.viewOf.count(v) && v->def() && !plan.inPlace.count(v) &&
                (v->def()->has(traits::Optimizer) || v->def()->has(traits::Elementwise));
    if (safe) {
      auto lu = lastUse.find(p);
      safe = lu == lastUse.end() || lu->second <= at[index[v->def()]];
    }
    if (safe) plan.inPlace[v] = g.outputName(i);
    else plan.paramCopies.push_back({v, g.outputName(i)});
  }
  // Nodes on the communication stream: their memory stays live until their join, the first later node
  // (a view runs nothing) that reads their result; after the in-place choice above, so only arena buffers
  // change (a parameter written while a collective still reads it is the join schedule's to order).
  std::vector<int> holdUntil(nodes.size(), -1);
  if (onCommStream)
    for (int k = 0; k < end; ++k) {
      if (!onCommStream(*nodes[k])) continue;
      int join = end;
      for (int m = k + 1; m < end; ++m) {
        if (isView(*nodes[m]) || at[m] >= join) continue;
        for (const Value* v : nodes[m]->operands())
          for (const Value* res : nodes[k]->results())
            if (root(v) == root(res)) join = at[m];  // a fused reader runs at its group's last member
      }
      holdUntil[k] = join;
      for (const Value* v : nodes[k]->operands())
        if (!root(v)->isParam() && !root(v)->isInput()) lastUse[root(v)] = std::max(lastUse.lookup(root(v)), join);
      for (const Value* v : nodes[k]->results()) lastUse[root(v)] = std::max(lastUse.lookup(root(v)), join);
    }
  // Results written over a dead operand (OpInfo::inPlaceResult, e.g. dlogits over the logits): the result
  // takes the operand's arena buffer when nothing reads that memory after the node (not an output, not a
  // parameter or input, not an in-place output, not a value kept inside a fusion group) and the sizes and dtypes
  // match (the operand may be a view of another shape).
  // After the holds above, so a collective still reading the operand keeps it.
  llvm::DenseMap<const Value*, const Value*> overwrites;
  for (int k = 0; k < end; ++k) {
    const Node* n = nodes[k];
    if (n->info().inPlaceResult < 0 || (groupOf && groupOf->lookup(n))) continue;
    const Value* res = n->result(static_cast<unsigned>(n->info().inPlaceResult));
    const Value* mem = root(n->operand(static_cast<unsigned>(n->info().inPlaceOperand)));
    if (auto it = overwrites.find(mem); it != overwrites.end()) mem = it->second;  // itself written in place
    const FusionGroup* mg = mem->def() && groupOf ? groupOf->lookup(mem->def()) : nullptr;
    if (!mem->def() || isExternal(mem) || plan.inPlace.count(mem) || (mg && mg->isInternal(mem)) || mem->dtype() != res->dtype() ||
        mem->type().numel() != res->type().numel())
      continue;
    if (lastUse.lookup(mem) != at[k]) continue;
    overwrites[res] = mem;
    lastUse[mem] = std::max(at[k], lastUse.lookup(res));  // res's readers and its views' now read mem
  }
  if (!overwrites.empty()) {
    for (auto& [v, owner] : plan.viewOf)
      if (overwrites.count(owner)) owner = overwrites.lookup(owner);
    for (auto [res, mem] : overwrites) plan.viewOf[res] = mem;
  }
  for (int k = 0; k < end; ++k) {
    const FusionGroup* fg = (groupOf ? groupOf->lookup(nodes[k]) : nullptr);
    for (const Value* v : nodes[k]->results()) {
      if (plan.inPlace.count(v) || plan.viewOf.count(v) || (fg && fg->isInternal(v)) || isExternal(v)) continue;
      auto lu = lastUse.find(v);
      plan.bufferOf[v] = static_cast<int>(plan.buffers.size());
      plan.buffers.push_back({v->type().bytes(), at[k], lu == lastUse.end() ? at[k] : std::max(at[k], lu->second)});
    }
    plan.workspaceOf.push_back(-1);
    if (k < static_cast<int>(workspaceBytes.size()) && workspaceBytes[k] > 0) {
      plan.workspaceOf.back() = static_cast<int>(plan.buffers.size());
      plan.buffers.push_back({workspaceBytes[k], k, std::max(k, holdUntil[k])});
    }
  }
  plan.arenaBytes = planMemory(plan.buffers, alignment);
  return plan;
}

}  // namespace tpc
