// `recompute(mode=full|selective)`: activation recomputation on the training step (after autodiff, cse and
// dce, before partition; nothing may CSE the step afterwards, or the copies would merge back).
// The forward is every node the loss output depends on; its nodes belong to the transformer block whose
// parameters they (or their operands) use, by the parameter scope `h.N.` of models/gpt, so blocks are
// found by names, not by op patterns. A block's output (a value a later block reads) is kept, as are
// values outside every block (the embeddings, the head). Then, before the first backward node of each
// block, the forward values the backward reads are recomputed from what is kept:
//   full:      everything inside the block (Megatron's full recompute, one block at a time): only block
//              boundaries stay alive between forward and backward.
//   selective: only cheap values: results of elementwise, normalization and movement ops; matmul and
//              attention outputs stay (recomputing them costs FLOPs; the rest costs only bandwidth).
// Dropout and attention masks are drawn by (seed, step, key, index), so a recomputed mask is the same
// mask and the losses do not change.
#include <functional>
#include <map>
#include <set>

#include "passes/builtin_passes.h"

namespace tpc {
namespace {

// The block index of a parameter name "h.N.*", else -1.
int64_t blockOfParam(const std::string& name) {
  if (name.rfind("h.", 0) != 0) return -1;
  size_t end = name.find('.', 2);
  if (end == std::string::npos || end == 2) return -1;
  int64_t b = 0;
  for (size_t i = 2; i < end; ++i) {
    if (name[i] < '0' || name[i] > '9') return -1;
    b = b * 10 + (name[i] - '0');
  }
  return b;
}

class RecomputePass final : public Pass {
 public:
  explicit RecomputePass(bool full) : full_(full) {}
  std::string_view name() const override { return "recompute"; }

  Result<bool> run(Graph& g) override {
    // Forward: the ancestors of the loss output.
    std::set<const Node*> forward;
    std::vector<const Value*> work;
    for (size_t i = 0; i < g.outputs().size(); ++i)
      if (g.outputName(i) == "loss") work.push_back(g.outputs()[i].value);
    if (work.empty()) return makeError("recompute: the graph has no output named loss (run it after autodiff)");
    while (!work.empty()) {
      const Value* v = work.back();
      work.pop_back();
      if (!v->def() || !forward.insert(v->def()).second) continue;
      for (const Value* o : v->def()->operands()) work.push_back(o);
    }
    // Blocks, in program order (operands come first).
    std::map<const Value*, int64_t> block;
    auto blockOf = [&](const Value* v) -> int64_t {
      if (v->isParam()) return blockOfParam(v->name());
      auto it = block.find(v);
      return it == block.end() ? -1 : it->second;
    };
    for (Node* n : g.nodes()) {
      if (!forward.count(n)) continue;
      int64_t b = -1;
      for (const Value* o : n->operands()) b = std::max(b, blockOf(o));
      for (const Value* r : n->results()) block[r] = b;
    }
    // Kept values: block outputs (read by a forward node of a later block), and in selective mode the
    // results of contractions (matmul, attention) and of everything else that is not cheap.
    std::set<const Value*> kept;
    for (Node* n : g.nodes()) {
      if (!forward.count(n)) continue;
      for (const Value* o : n->operands())
        if (!o->isParam() && blockOf(o) >= 0 && blockOf(o) < blockOf(n->result(0))) kept.insert(o);
      if (!full_ && !(n->has(traits::Elementwise) || n->has(traits::Normalization) || n->has(traits::Movement)))
        for (const Value* r : n->results()) kept.insert(r);
    }
    auto recomputable = [&](const Value* v) {
      return v->def() && forward.count(v->def()) && blockOf(v) >= 0 && !kept.count(v) &&
             !v->def()->has(traits::Collective);
    };
    // Per block: the copies made so far, and where they go (before the block's first backward reader).
    std::map<int64_t, std::map<const Value*, Value*>> copies;
    bool changed = false;
    std::function<Result<Value*>(Value*, Node*)> copyOf = [&](Value* v, Node* before) -> Result<Value*> {
      if (!recomputable(v)) return v;
      auto& memo = copies[blockOf(v)];
      if (auto it = memo.find(v); it != memo.end()) return it->second;
      Node* d = v->def();
      std::vector<Value*> operands;
      for (Value* o : d->operands()) {
        TPC_ASSIGN(Value * c, copyOf(o, before));
        operands.push_back(c);
      }
      TPC_ASSIGN(Node * c, g.create(d->op(), operands, d->attrs(), before));
      c->setLoc(d->loc());
      for (unsigned r = 0; r < d->numResults(); ++r) {
        c->result(r)->setPlacement(d->result(r)->placement());
        memo[d->result(r)] = c->result(r);
      }
      changed = true;
      return memo.at(v);
    };
    // Each block's copies go before its first backward reader; a block's forward seen again (the next
    // micro-batch under gradient accumulation) starts a new group.
    std::map<int64_t, Node*> firstReader;
    for (Node* n : g.nodeVector()) {
      if (forward.count(n)) {
        int64_t b = blockOf(n->result(0));
        firstReader.erase(b);
        copies.erase(b);
        continue;
      }
      for (unsigned i = 0; i < n->numOperands(); ++i) {
        Value* v = n->operand(i);
        if (!recomputable(v)) continue;
        int64_t b = blockOf(v);
        Node*& at = firstReader[b];
        if (!at) at = n;
        TPC_ASSIGN(Value * c, copyOf(v, at));
        n->setOperand(i, c);
      }
    }
    return changed;
  }

 private:
  bool full_;
};

}  // namespace

Result<std::unique_ptr<Pass>> createRecomputePass(const PassOptions& opts) {
  std::string mode = opts.getString("mode", "full");
  if (mode != "full" && mode != "selective")
    return makeError("pass 'recompute': option mode=", mode, " must be full or selective");
  std::unique_ptr<Pass> p = std::make_unique<RecomputePass>(mode == "full");
  return p;
}

}  // namespace tpc
