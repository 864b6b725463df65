// `data-parallel(dp=N[, zero1=true])`: splits the batch of every batch input ([..., batch, seq] integer inputs
// such as %tokens and %targets) over mesh axis dp. Everything else follows from the rules: gradients come out
// partial over dp and the AdamW update (which needs the param's placement) all-reduces them. zero1=true
// (ZeRO-1, distributed_optimizer.cpp) splits the AdamW moments over dp instead: reduce_scatter, the update on
// 1/dp, all_gather.
#include "passes/builtin_passes.h"
#include "passes/sharding/sharding.h"

namespace tpc {
namespace {

const char* kPolicy = "data-parallel";

class DataParallelPass final : public Pass {
 public:
  DataParallelPass(int64_t dp, bool zero1) : dp_(dp), zero1_(zero1) {}
  std::string_view name() const override { return kPolicy; }
  Result<bool> run(Graph& g) override {
    TPC_TRY(ensureMeshAxis(g, "dp", dp_, kPolicy));
    bool any = false;
    for (Value* v : g.inputs()) {
      if (v->type().rank() < 2 || isFloat(v->dtype())) continue;
      int64_t d = v->type().rank() - 2;  // the batch dim of [..., batch, seq] (a leading [accum] dim allowed)
      if (v->shape()[d] % dp_ != 0)
        return makeError(kPolicy, ": dp=", dp_, " does not divide the batch (dim ", d, " = ", v->shape()[d],
                         ") of input ", v->name(), " ", v->type().str(), " on mesh axis dp");
      TPC_TRY(annotatePlacement(v, "dp", AxisPlacement::split(d), kPolicy));
      any = true;
    }
    if (!any) return makeError(kPolicy, ": the graph has no integer batch input ([batch, seq]) to split over dp");
    for (Value* p : g.params())
      if (p->placement()) TPC_TRY(annotatePlacement(p, "dp", AxisPlacement::replicated(), kPolicy));
    if (zero1_) {
      bool optimizer = false;
      for (Node* n : g.nodes()) optimizer |= n->op() == OpKind::AdamWUpdate;
      if (!optimizer)
        return makeError(kPolicy, ": zero1=true shards the AdamW state, but the graph has no adamw_update; run "
                         "data-parallel after autodiff");
      TPC_ASSIGN(std::vector<std::string> replicated, shardOptimizerStateOverDp(g, dp_));
      (void)replicated;  // shown per rank by `tpc dump --summary`
    }
    return true;
  }

 private:
  int64_t dp_;
  bool zero1_;
};

const char* kSp = "sequence-parallel";

// `sequence-parallel`: Megatron SP on top of megatron-tp. The residual stream (every LayerNorm's input) is
// split on the sequence dim over tp, so LN, dropout and residual adds run on T/tp rows; the rules then
// all_gather before the column-parallel matmuls and reduce_scatter after the row-parallel ones.
class SequenceParallelPass final : public Pass {
 public:
  std::string_view name() const override { return kSp; }
  Result<bool> run(Graph& g) override {
    int64_t tp = g.mesh().axisSize("tp");
    if (g.mesh().axisIndex("tp") < 0)
      return makeError(kSp, ": the graph has no tp mesh axis; run megatron-tp(tp=N) first");
    TPC_TRY(checkNotPartitioned(g, kSp));
    for (Node* n : g.nodes()) {
      if (n->op() != OpKind::LayerNorm) continue;
      Value* x = n->operand(0);
      if (x->type().rank() < 3) continue;
      int64_t d = x->type().rank() - 2;
      if (x->shape()[d] % tp != 0)
        return makeError(kSp, ": tp=", tp, " does not divide the sequence (dim ", d, " = ", x->shape()[d], ") of tensor ",
                         x->hasName() ? x->name() : std::string("(layer norm input)"), " ", x->type().str(),
                         " on mesh axis tp");
      TPC_TRY(annotatePlacement(x, "tp", AxisPlacement::split(d), kSp));
    }
    return true;
  }
};

// `partition(rank=R)`: propagation, then rank R's program in place of the graph.
class PartitionPass final : public Pass {
 public:
  explicit PartitionPass(int64_t rank) : rank_(rank) {}
  std::string_view name() const override { return "partition"; }
  Result<bool> run(Graph& g) override {
    if (g.mesh().empty()) return false;
    TPC_TRY(checkNotPartitioned(g, "partition"));
    TPC_TRY(propagatePlacements(g));
    TPC_ASSIGN(std::unique_ptr<Graph> local, partitionForRank(g, rank_));
    replaceGraph(g, *local);
    return true;
  }

 private:
  // Graphs are not movable (nodes point at their graph): rebuild g's contents from `src`.
  static void replaceGraph(Graph& g, const Graph& src) {
    g.clearOutputs();
    auto nodes = g.nodeVector();
    for (auto it = nodes.rbegin(); it != nodes.rend(); ++it) g.erase(*it);
    for (Value* v : std::vector<Value*>(g.inputs())) g.removeArgument(v);
    for (Value* v : std::vector<Value*>(g.params())) g.removeArgument(v);
    llvm::DenseMap<const Value*, Value*> map;
    for (const Value* v : src.inputs()) {
      Value* n = g.addInput(v->name(), v->type());
      n->setPlacement(v->placement());
      map[v] = n;
    }
    for (const Value* v : src.params()) {
      Value* n = g.addParam(v->name(), v->type(), v->init());
      n->setPlacement(v->placement());
      map[v] = n;
    }
    g.setMesh(src.mesh());
    for (const Node* n : src.nodes()) {
      llvm::SmallVector<Value*, 4> ops;
      for (const Value* o : n->operands()) ops.push_back(map.lookup(o));
      llvm::SmallVector<TensorType, 2> types;
      for (const Value* r : n->results()) types.push_back(r->type());
      Node* c = g.createWithTypes(n->op(), ops, n->attrs(), types);
      for (unsigned r = 0; r < n->numResults(); ++r) {
        map[n->result(r)] = c->result(r);
        c->result(r)->setName(n->result(r)->name());
      }
    }
    for (size_t i = 0; i < src.outputs().size(); ++i) g.addOutput(map.lookup(src.outputs()[i].value), src.outputs()[i].name);
  }
  int64_t rank_;
};

// `sharding-propagate`: only the propagation (every value gets its placement), for dumps and tests.
class PropagatePass final : public Pass {
 public:
  std::string_view name() const override { return "sharding-propagate"; }
  Result<bool> run(Graph& g) override {
    TPC_TRY(propagatePlacements(g));
    return !g.mesh().empty();
  }
};

}  // namespace

Result<std::unique_ptr<Pass>> createDataParallelPass(const PassOptions& o) {
  TPC_ASSIGN(int64_t dp, o.getInt("dp", 0));
  TPC_ASSIGN(bool zero1, o.getBool("zero1", false));
  if (!o.has("dp")) return makeError("pass 'data-parallel': option dp is required (e.g. data-parallel(dp=2))");
  if (dp < 1) return makeError("pass 'data-parallel': option dp=", dp, " must be >= 1 (e.g. data-parallel(dp=2))");
  std::unique_ptr<Pass> p = std::make_unique<DataParallelPass>(dp, zero1);
  return p;
}
std::unique_ptr<Pass> createSequenceParallelPass() { return std::make_unique<SequenceParallelPass>(); }
Result<std::unique_ptr<Pass>> createPartitionPass(const PassOptions& o) {
  TPC_ASSIGN(int64_t rank, o.getInt("rank", 0));
  std::unique_ptr<Pass> p = std::make_unique<PartitionPass>(rank);
  return p;
}
std::unique_ptr<Pass> createShardingPropagatePass() { return std::make_unique<PropagatePass>(); }

}  // namespace tpc
