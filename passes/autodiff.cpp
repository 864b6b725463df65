// Reverse-mode autodiff over the IR (appendGradients) and the training step built from it
// (buildTrainingStep: forward + backward per micro-batch, global-norm clipping, AdamW), plus the `autodiff`
// pass that runs it from a pipeline.
#include "passes/autodiff.h"

#include <algorithm>

#include "ir/assert.h"
#include "passes/builtin_passes.h"
#include "passes/pass_registry.h"
#include "passes/random_space.h"
#include "passes/vjp_rules.h"
#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/DenseSet.h"

namespace tpc {

namespace {

AttrDict oneAttr(const char* k, Attr v) {
  AttrDict d;
  d.set(k, std::move(v));
  return d;
}

// The nodes `root` depends on, and `root`'s own chain of values, as a set of values.
llvm::DenseSet<const Value*> ancestorsOf(llvm::ArrayRef<Node*> nodes, Value* root) {
  llvm::DenseSet<const Value*> live;
  live.insert(root);
  for (auto it = nodes.rbegin(); it != nodes.rend(); ++it) {
    Node* n = *it;
    bool any = std::any_of(n->results().begin(), n->results().end(), [&](Value* r) { return live.count(r) != 0; });
    if (!any) continue;
    for (Value* op : n->operands()) live.insert(op);
  }
  return live;
}

}  // namespace

Result<std::vector<Value*>> appendGradients(Graph& g, Value* loss, llvm::ArrayRef<Value*> wrt, Value* seed,
                                            llvm::ArrayRef<Node*> scope) {
  if (!isFloat(loss->dtype()) || loss->type().rank() != 0)
    return makeError("autodiff: the loss must be a float scalar, got ", loss->type().str());
  for (Value* w : wrt)
    if (!isFloat(w->dtype()))
      return makeError("autodiff: cannot take a gradient with respect to '", w->name(), "' of type ", w->type().str(),
                       " (only float values have gradients)");

  // A value varies when it is a float value computed from one of `wrt`; only those get cotangents.
  std::vector<Node*> all;
  if (scope.empty()) all = g.nodeVector();
  llvm::ArrayRef<Node*> nodes = scope.empty() ? llvm::ArrayRef<Node*>(all) : scope;
  llvm::DenseSet<const Value*> live = ancestorsOf(nodes, loss);
  llvm::DenseSet<const Value*> varies(wrt.begin(), wrt.end());
  std::vector<Node*> active;  // forward nodes on a path from wrt to loss, in program order
  for (Node* n : nodes) {
    bool in = std::any_of(n->operands().begin(), n->operands().end(), [&](Value* v) { return varies.count(v) != 0; });
    if (!in) continue;
    bool onPath = false;
    for (Value* r : n->results())
      if (isFloat(r->dtype())) {
        varies.insert(r);
        onPath |= live.count(r) != 0;
      }
    if (onPath) active.push_back(n);
  }

  VjpBuilder b(g);
  llvm::DenseMap<const Value*, Value*> cot;
  auto accumulate = [&](Value* v, Value* d) -> Status {
    auto [it, inserted] = cot.try_emplace(v, d);
    if (inserted) return {};
    TPC_ASSIGN(it->second, b.op(OpKind::Add, {it->second, d}));
    return {};
  };
  if (varies.count(loss) && seed) {
    if (seed->dtype() != loss->dtype()) {
      TPC_ASSIGN(seed, b.op(OpKind::Cast, {seed}, oneAttr("to", Attr(loss->dtype()))));
    }
    cot[loss] = seed;
  } else if (varies.count(loss)) {
    AttrDict one;
    one.set("shape", std::vector<int64_t>{});
    one.set("value", 1.0);
    one.set("dtype", loss->dtype());
    TPC_ASSIGN(Value * seed, b.op(OpKind::Full, {}, std::move(one)));
    cot[loss] = seed;
  }

  for (auto it = active.rbegin(); it != active.rend(); ++it) {
    Node* n = *it;
    std::vector<Value*> dys;
    bool any = false;
    for (Value* r : n->results()) {
      auto c = cot.find(r);
      dys.push_back(c == cot.end() ? nullptr : c->second);
      any |= c != cot.end();
    }
    if (!any) continue;
    // Single-result ops always see their cotangent; multi-result rules handle missing ones themselves.
    std::vector<char> needsStore;
    for (Value* op : n->operands()) needsStore.push_back(varies.count(op) != 0);
    llvm::SmallVector<bool, 4> needs(needsStore.begin(), needsStore.end());
    TPC_ASSIGN(std::vector<Value*> grads, applyVjp(b, VjpArgs{*n, dys, needs}));
    for (unsigned i = 0; i < grads.size(); ++i)
      if (grads[i]) TPC_TRY(accumulate(n->operand(i), grads[i]));
  }

  std::vector<Value*> out;
  for (Value* w : wrt) {
    auto c = cot.find(w);
    Value* d = nullptr;
    if (c != cot.end()) {
      d = c->second;
    } else {
      TPC_ASSIGN(d, b.zeros(w->type()));
    }
    if (!d->hasName() && w->hasName()) d->setName("d." + w->name());
    out.push_back(d);
  }
  return out;
}

namespace {

Result<Value*> make(Graph& g, OpKind op, llvm::ArrayRef<Value*> operands, AttrDict attrs = {}) {
  TPC_ASSIGN(Node * n, g.create(op, operands, std::move(attrs)));
  return n->result(0);
}

}  // namespace

Status buildTrainingStep(Graph& g, const TrainingStepOptions& o) {
  // The forward: its loss output, its inputs and parameters.
  Value* loss = nullptr;
  for (size_t i = 0; i < g.outputs().size(); ++i)
    if (g.outputName(i) == o.lossOutput) loss = g.outputs()[i].value;
  if (!loss) {
    std::string known;
    for (size_t i = 0; i < g.outputs().size(); ++i) known += (i ? ", " : "") + g.outputName(i);
    return makeError("autodiff: the graph @", g.name(), " has no output named '", o.lossOutput, "' to minimize (outputs: ",
                     known.empty() ? "none" : known, "); pass loss=<output name>");
  }
  if (!isFloat(loss->dtype()) || loss->type().rank() != 0)
    return makeError("autodiff: the loss output '", o.lossOutput, "' must be a float scalar, got ", loss->type().str());
  if (o.accumSteps < 1) return makeError("autodiff: accum=", o.accumSteps, " must be >= 1");
  if (o.clipGrad < 0) return makeError("autodiff: clip-grad=", o.clipGrad, " must be >= 0 (0 disables clipping)");
  std::vector<Value*> inputs = g.inputs();
  std::vector<Value*> params = g.params();
  for (Value* p : params)
    if (!isFloat(p->dtype()))
      return makeError("autodiff: parameter '", p->name(), "' is ", p->type().str(), "; only float parameters can be trained");
  for (Value* v : inputs)
    if (v->name() == "lr" || v->name() == "step")
      return makeError("autodiff: the forward graph already has an input named '", v->name(),
                       "'; the training step adds %lr and %step itself (rename it)");
  if (o.dynamicLossScale)
    for (Value* v : inputs)
      if (v->name() == "loss_scale")
        return makeError("autodiff: the forward graph already has an input named 'loss_scale'; the training step "
                         "adds %loss_scale itself (rename it)");
  std::vector<Node*> forward = g.nodeVector();
  // The step holds a copy of the forward, and its backward, per micro-batch: bound what that builds (about a
  // minute on two cores at the bound) instead of running out of time or memory.
  const int64_t maxMicroBatches = std::max<int64_t>(1, kMaxUnrolledForwardNodes / std::max<int64_t>(1, forward.size()));
  if (o.accumSteps > maxMicroBatches)
    return makeError("autodiff: accum=", o.accumSteps, " micro-batches a step is more than this model's ",
                     maxMicroBatches, " (the step holds each micro-batch's forward of ", forward.size(),
                     " ops, at most ", kMaxUnrolledForwardNodes, " in all): raise --micro-batch-size or lower "
                     "--global-batch-size (global = micro x accumulation x dp)");
  g.clearOutputs();
  // Dynamic loss scaling (fp16): the backward starts from d(loss) = %loss_scale instead of 1, so small
  // fp16 gradients do not flush to zero; the summed gradients are unscaled before the norm and AdamW. The
  // scale is an input, so the trainer changes it without recompiling (or recapturing a CUDA graph).
  Value* lossScale = o.dynamicLossScale ? g.addInput("loss_scale", TensorType(DType::f32, {})) : nullptr;

  // Forward + backward, once per micro-batch, accumulating the loss and the gradients.
  Value* lossSum = nullptr;
  std::vector<Value*> gradSum(params.size(), nullptr);
  auto addInto = [&](Value*& sum, Value* v) -> Status {
    if (!sum) {
      sum = v;
      return {};
    }
    TPC_ASSIGN(sum, make(g, OpKind::Add, {sum, v}));
    return {};
  };
  if (o.accumSteps == 1) {
    lossSum = loss;
    TPC_ASSIGN(gradSum, appendGradients(g, loss, params, lossScale));
  } else {
    // Inputs get a leading [accumSteps] dim; micro-batch i reads slice i of each and runs a copy of the
    // forward nodes that the loss needs, then its backward, before micro-batch i+1 starts.
    std::vector<Shape> microShapes;
    for (Value* v : inputs) {
      microShapes.push_back(v->shape());
      Shape s = v->shape();
      s.insert(s.begin(), o.accumSteps);
      v->setType(TensorType(v->dtype(), s));
    }
    llvm::DenseSet<const Value*> live = ancestorsOf(forward, loss);
    for (int64_t i = 0; i < o.accumSteps; ++i) {
      llvm::DenseMap<const Value*, Value*> map;
      std::vector<Node*> micro;  // the nodes of micro-batch i's forward: all its loss depends on
      for (size_t k = 0; k < inputs.size(); ++k) {
        AttrDict sl;
        sl.set("axis", int64_t(0));
        sl.set("start", i);
        sl.set("end", i + 1);
        TPC_ASSIGN(Value * s, make(g, OpKind::Slice, {inputs[k]}, std::move(sl)));
        TPC_ASSIGN(Value * r, make(g, OpKind::Reshape, {s},
                                   oneAttr("shape", std::vector<int64_t>(microShapes[k].begin(), microShapes[k].end()))));
        if (inputs[k]->hasName()) r->setName(inputs[k]->name() + ".mb" + std::to_string(i));
        map[inputs[k]] = r;
        micro.insert(micro.end(), {s->def(), r->def()});
      }
      for (Node* n : forward) {
        bool needed = std::any_of(n->results().begin(), n->results().end(), [&](Value* r) { return live.count(r) != 0; });
        if (!needed) continue;
        llvm::SmallVector<Value*, 4> ops;
        for (Value* v : n->operands()) ops.push_back(map.count(v) ? map[v] : v);
        AttrDict attrs = n->attrs();
        stackRandomSpace(attrs, *n, i, o.accumSteps);  // micro-batch i draws its own block of the step's masks
        TPC_ASSIGN(Node * c, g.create(n->op(), ops, std::move(attrs)));
        micro.push_back(c);
        for (unsigned r = 0; r < n->numResults(); ++r) {
          map[n->result(r)] = c->result(r);
          c->result(r)->setPlacement(n->result(r)->placement());  // a sharding policy's hints, per micro-batch
          if (n->result(r)->hasName()) c->result(r)->setName(n->result(r)->name() + ".mb" + std::to_string(i));
        }
      }
      Value* microLoss = map.lookup(loss);
      TPC_ASSERT_GRAPH(g, microLoss != nullptr, "autodiff: micro-batch loss missing");
      TPC_TRY(addInto(lossSum, microLoss));
      TPC_ASSIGN(std::vector<Value*> grads, appendGradients(g, microLoss, params, lossScale, micro));
      for (size_t k = 0; k < params.size(); ++k) TPC_TRY(addInto(gradSum[k], grads[k]));
    }
    // The original forward read the micro-batch shapes; its copies replaced it.
    for (auto it = forward.rbegin(); it != forward.rend(); ++it) g.erase(*it);
    double inv = 1.0 / static_cast<double>(o.accumSteps);
    TPC_ASSIGN(lossSum, make(g, OpKind::Scale, {lossSum}, oneAttr("factor", inv)));
    for (Value*& d : gradSum) {
      TPC_ASSIGN(d, make(g, OpKind::Scale, {d}, oneAttr("factor", inv)));
    }
  }
  if (lossScale && !params.empty()) {
    // grad *= 1 / loss_scale: an overflowed (inf) or NaN gradient stays non-finite, so grad_norm marks the
    // step and the backend skips its update (backend.h).
    AttrDict one;
    one.set("shape", std::vector<int64_t>{});
    one.set("value", 1.0);
    TPC_ASSIGN(Value * unit, make(g, OpKind::Full, {}, std::move(one)));
    TPC_ASSIGN(Value * inverse, make(g, OpKind::Div, {unit, lossScale}));
    inverse->setName("inverse_loss_scale");
    for (Value*& d : gradSum) {
      Value* s = inverse;
      if (d->dtype() != DType::f32) {
        TPC_ASSIGN(s, make(g, OpKind::Cast, {inverse}, oneAttr("to", d->dtype())));
      }
      TPC_ASSIGN(d, make(g, OpKind::Mul, {d, s}));
    }
  }
  for (size_t k = 0; k < params.size(); ++k)
    if (params[k]->hasName()) gradSum[k]->setName("d." + params[k]->name());

  Value* lr = g.addInput("lr", TensorType(DType::f32, {}));
  Value* step = g.addInput("step", TensorType(DType::f32, {}));
  g.addOutput(lossSum, "loss");

  // Global-norm clipping: grad *= min(1, clip / (norm + 1e-6)), the norm taken before clipping.
  Value* norm = nullptr;
  if (!params.empty()) {
    TPC_ASSIGN(norm, make(g, OpKind::GlobalNorm, gradSum));
  } else {
    AttrDict z;
    z.set("shape", std::vector<int64_t>{});
    z.set("value", 0.0);
    TPC_ASSIGN(norm, make(g, OpKind::Full, {}, std::move(z)));
  }
  if (!norm->hasName()) norm->setName("grad_norm");
  g.addOutput(norm, "grad_norm");
  if (o.clipGrad > 0 && !params.empty()) {
    TPC_ASSIGN(Value * scale, make(g, OpKind::ClipScale, {norm}, oneAttr("max_norm", o.clipGrad)));
    for (Value*& d : gradSum) {
      Value* s = scale;
      if (d->dtype() != DType::f32) {
        TPC_ASSIGN(s, make(g, OpKind::Cast, {scale}, oneAttr("to", d->dtype())));
      }
      TPC_ASSIGN(d, make(g, OpKind::Mul, {d, s}));
    }
  }

  // AdamW, one update per parameter; weight decay for matrices (rank >= 2) only, never biases or gains
  // (Megatron's rule). The name counts too: megatron-tp views the fused c_attn.bias [3D] as [3, D] so that
  // tp can cut q, k and v by heads, and decaying it would make tp train a different model than one rank.
  auto decays = [](const Value* p) {
    const std::string& n = p->name();
    bool bias = n == "bias" || (n.size() >= 5 && n.compare(n.size() - 5, 5, ".bias") == 0);
    return p->type().rank() >= 2 && !bias;
  };
  for (size_t k = 0; k < params.size(); ++k) {
    Value* p = params[k];
    TensorType st(DType::f32, p->shape());
    Value* m = g.addParam(p->name() + ".adam_m", st, InitSpec{"zeros", {}});
    Value* v = g.addParam(p->name() + ".adam_v", st, InitSpec{"zeros", {}});
    AttrDict a;
    a.set("beta1", o.beta1);
    a.set("beta2", o.beta2);
    a.set("eps", o.eps);
    a.set("weight_decay", decays(p) ? o.weightDecay : 0.0);
    TPC_ASSIGN(Node * u, g.create(OpKind::AdamWUpdate, {p, gradSum[k], m, v, lr, step}, std::move(a)));
    g.addOutput(u->result(0), p->name());
    g.addOutput(u->result(1), m->name());
    g.addOutput(u->result(2), v->name());
  }
  return {};
}

namespace {

// `autodiff`: rewrites a forward graph (with a scalar loss output) into its whole training step.
class AutodiffPass final : public Pass {
 public:
  explicit AutodiffPass(TrainingStepOptions o) : o_(std::move(o)) {}
  std::string_view name() const override { return "autodiff"; }
  Result<bool> run(Graph& g) override {
    TPC_TRY(buildTrainingStep(g, o_));
    return true;
  }

 private:
  TrainingStepOptions o_;
};

}  // namespace

Result<std::unique_ptr<Pass>> createAutodiffPass(const PassOptions& opts) {
  TrainingStepOptions o;
  TPC_ASSIGN(o.accumSteps, opts.getInt("accum", o.accumSteps));
  TPC_ASSIGN(o.clipGrad, opts.getFloat("clip-grad", o.clipGrad));
  TPC_ASSIGN(o.beta1, opts.getFloat("beta1", o.beta1));
  TPC_ASSIGN(o.beta2, opts.getFloat("beta2", o.beta2));
  TPC_ASSIGN(o.eps, opts.getFloat("eps", o.eps));
  TPC_ASSIGN(o.weightDecay, opts.getFloat("weight-decay", o.weightDecay));
  o.lossOutput = opts.getString("loss", o.lossOutput);
  TPC_ASSIGN(o.dynamicLossScale, opts.getBool("loss-scale", o.dynamicLossScale));
  if (o.accumSteps < 1) return makeError("pass 'autodiff': option accum=", o.accumSteps, " must be >= 1");
  if (o.clipGrad < 0) return makeError("pass 'autodiff': option clip-grad=", o.clipGrad, " must be >= 0 (0 disables)");
  std::unique_ptr<Pass> p = std::make_unique<AutodiffPass>(o);
  return p;
}

}  // namespace tpc
