// Propagation and partitioning: one sweep over the training step in program order picks, per node and mesh
// axis, the cheapest strategy of the op's rules (cost = bytes moved to bring the operands into place), and
// either records the placements (propagation) or emits the rank's local program (partition). Both modes
// make the same choices, so partitioning an annotated graph reproduces the annotation.
#include <map>
#include <set>

#include "ir/assert.h"
#include "ir/printer.h"
#include "passes/builtin_passes.h"
#include "passes/random_space.h"
#include "passes/sharding/sharding.h"

namespace tpc {
namespace {

using sharding::AxisStrategy;
using AP = AxisPlacement;

Placement allR(const Mesh& m) {
  Placement p;
  for (const MeshAxis& a : m.axes) p.set(a.name, AP::replicated());
  return p;
}

// Placement with every mesh axis listed, in mesh order (so str() is a canonical key).
Placement canonical(const Placement& p, const Mesh& m) {
  Placement c;
  for (const MeshAxis& a : m.axes) c.set(a.name, p.get(a.name));
  return c;
}

bool hasP(const Placement& p) {
  for (const auto& [axis, ap] : p.axes)
    if (ap.isP()) return true;
  return false;
}

// Whether a policy's hint names `axis`: a hint says nothing about the axes it leaves out (sequence-parallel's
// [tp:S(1)] on a dp x tp mesh leaves dp to the rules; reading it as dp:R would gather the batch over dp).
bool names(const Placement& hint, const std::string& axis) {
  for (const auto& [a, ap] : hint.axes)
    if (a == axis) return true;
  return false;
}

class Sweep {
 public:
  // rank < 0: propagation only (records placements on `g`'s values); else builds that rank's program.
  Sweep(const Graph& g, int64_t rank) : g_(g), mesh_(g.mesh()), rank_(rank) {
    if (rank >= 0) {
      coords_ = sharding::rankCoords(mesh_, rank);
      local_ = std::make_unique<Graph>(g.name());
      local_->setMesh(mesh_);
      local_->setSourceName(g.sourceName());
    }
  }

  Status run();
  std::map<const Value*, Placement> placed;  // the placement each value is produced in (after any hint)
  std::unique_ptr<Graph> local_;
  std::set<const Value*> zeroShares;  // the local zeros of R -> P on a rank other than the axis's first

 private:
  struct Cur {
    Placement pl;
    Value* local = nullptr;
  };
  bool emitting() const { return rank_ >= 0; }
  int64_t coord(const std::string& axis) const { return coords_[mesh_.axisIndex(axis)]; }
  int64_t bytes(const Value* v) const { return v->type().bytes(); }

  int64_t axisCost(const Value* v, AP from, AP to) const;
  int64_t cost(const Value* v, const std::string& axis, AP to) const;
  bool movesParam(const Value* v, const std::string& axis, AP to) const;
  Result<Value*> convert(const Value* v, const Placement& to);
  Result<Value*> step(Value* x, const std::string& axis, AP from, AP to, const Shape& globalShape);
  Result<Value*> emit(OpKind op, llvm::ArrayRef<Value*> ops, AttrDict a);
  Status visit(const Node& n);
  Status visitGlobalNorm(const Node& n, const std::vector<Placement>& need);
  Status emitVocabParallel(const Node& n, const std::string& axis, llvm::ArrayRef<Value*> ops);
  Status emitLocal(const Node& n, llvm::ArrayRef<Value*> ops, const std::vector<Placement>& in,
                   const std::vector<Placement>& out, std::vector<Value*>& results);

  const Graph& g_;
  Mesh mesh_;
  int64_t rank_;
  std::vector<int64_t> coords_;
  std::map<const Value*, Cur> cur_;
  std::set<const Value*> freeParams_;                               // unplaced params: adopt their first use
  std::set<const Value*> paramViews_;                               // params and values computed from params only
  std::map<std::pair<const Value*, std::string>, Value*> avail_;    // conversions already made
  std::map<const Value*, std::pair<Value*, Value*>> vocabStats_;   // logits -> (global max, global sum exp)
};

int64_t Sweep::axisCost(const Value* v, AP from, AP to) const {
  if (from == to || (from.isR() && to.isS()) || (from.isR() && to.isP())) return 0;  // local slice / zero share
  int64_t b = bytes(v);
  if (from.isP() && to.isR()) return 2 * b;
  return b;  // gather, reduce-scatter, re-split
}

int64_t Sweep::cost(const Value* v, const std::string& axis, AP to) const {
  if (freeParams_.count(v)) return 0;
  const Cur& c = cur_.at(v);
  AP from = c.pl.get(axis);
  if (from == to) return 0;
  Placement want = c.pl;
  want.set(axis, to);
  if (avail_.count({v, canonical(want, mesh_).str()})) return 0;
  return axisCost(v, from, to);
}

// A param placed by a policy stays where the policy put it: using it (or a view of it: a transpose, a cast)
// in another layout, e.g. gathering a column-parallel weight to keep the activations sequence-split, moves
// it every step, leaves its gradient in the wrong layout for the update and overrides the policy's choice.
// Bytes alone cannot see that: one matmul's gather of a weight may be cheaper than the activation's, yet
// its result is then split where attention cannot use it and every later op pays.
bool Sweep::movesParam(const Value* v, const std::string& axis, AP to) const {
  return paramViews_.count(v) && cost(v, axis, to) > 0;
}

Result<Value*> Sweep::emit(OpKind op, llvm::ArrayRef<Value*> ops, AttrDict a) {
  TPC_ASSIGN(Node * n, local_->create(op, ops, std::move(a)));
  return n->result(0);
}

// One axis's move of local value x from `from` to `to` (x's other axes unchanged).
Result<Value*> Sweep::step(Value* x, const std::string& axis, AP from, AP to, const Shape& globalShape) {
  if (!emitting() || from == to) return x;
  int64_t n = mesh_.axisSize(axis);
  if (from.isP() && to.isR()) return emit(OpKind::AllReduce, {x}, attrs({{"axis", axis}, {"op", "sum"}}));
  if (from.isP() && to.isS())
    return emit(OpKind::ReduceScatter, {x}, attrs({{"axis", axis}, {"dim", to.dim}, {"op", "sum"}}));
  if (from.isS() && (to.isR() || to.isS() || to.isP())) {
    TPC_ASSIGN(Value * g, emit(OpKind::AllGather, {x}, attrs({{"axis", axis}, {"dim", from.dim}})));
    return step(g, axis, AP::replicated(), to, globalShape);
  }
  if (from.isR() && to.isS()) {
    int64_t len = x->shape()[to.dim] / n, k = coord(axis);
    return emit(OpKind::Slice, {x}, attrs({{"axis", to.dim}, {"start", k * len}, {"end", (k + 1) * len}}));
  }
  if (from.isR() && to.isP()) {  // rank 0 of the axis holds the value, the others zeros
    if (coord(axis) == 0) return x;
    TPC_ASSIGN(Value * z, emit(OpKind::Scale, {x}, attrs({{"factor", 0.0}})));
    zeroShares.insert(z);
    return z;
  }
  TPC_ASSERT(false, "sharding: no conversion from " + from.str() + " to " + to.str());
  return x;
}

Result<Value*> Sweep::convert(const Value* v, const Placement& toIn) {
  Placement to = canonical(toIn, mesh_);
  if (freeParams_.count(v)) {  // an unplaced param takes the placement its first consumer needs
    // ... but never a partial one, which would sum the ranks' copies of the parameter each step: it is replicated
    // on such an axis, and the consumer gets the zero share below (rank 0 the value, the others zeros).
    Placement adopt = to;
    for (const MeshAxis& a : mesh_.axes)
      if (adopt.get(a.name).isP()) adopt.set(a.name, AP::replicated());
    adopt = canonical(adopt, mesh_);
    freeParams_.erase(v);
    cur_[v].pl = adopt;
    placed[v] = adopt;
    if (emitting()) cur_[v].local->setType(TensorType(v->dtype(), sharding::localShape(v->shape(), adopt, mesh_)));
  }
  Cur& c = cur_.at(v);
  if (c.pl == to) return c.local;
  std::string key = to.str();
  if (auto it = avail_.find({v, key}); it != avail_.end()) return it->second;
  if (v->dtype() == DType::i32 || v->dtype() == DType::i64) {
    for (const MeshAxis& a : mesh_.axes)
      if (c.pl.get(a.name) != to.get(a.name) && !(c.pl.get(a.name).isR() && to.get(a.name).isS()))
        return makeError("sharding: integer value ", v->hasName() ? v->name() : std::string("(unnamed)"), " ",
                         v->type().str(), " would need a collective on mesh axis ", a.name,
                         " (from ", c.pl.get(a.name).str(), " to ", to.get(a.name).str(), ")");
  }
  Value* x = c.local;
  Placement at = c.pl;
  // P first (reduce), then gathers, then splits: each step keeps the other axes' layout. A reduce-scatter
  // onto a dim that another axis still splits waits until that axis is gathered (it would nest the wrong way
  // round, e.g. a wpe grad S(0) over tp under sp going to S(0) over dp under ZeRO-1); gathers keep P.
  auto splitByOther = [&](const std::string& axis, int64_t dim) {
    for (const MeshAxis& o : mesh_.axes)
      if (o.name != axis && at.get(o.name).isS() && at.get(o.name).dim == dim) return true;
    return false;
  };
  for (int phase = 0; phase < 4; ++phase)
    for (const MeshAxis& a : mesh_.axes) {
      AP from = at.get(a.name), want = to.get(a.name);
      if (from == want) continue;
      bool now = phase == 0   ? from.isP() && !(want.isS() && splitByOther(a.name, want.dim))
                 : phase == 1 ? from.isS()
                 : phase == 2 ? from.isP()
                              : true;
      if (!now) continue;
      TPC_ASSIGN(x, step(x, a.name, from, want, v->shape()));
      at.set(a.name, want);
    }
  avail_[{v, key}] = x;
  if (hasP(c.pl) && !hasP(to)) c = Cur{to, x};  // reduced once, every later consumer reads the sum
  return x;
}

Status Sweep::emitLocal(const Node& n, llvm::ArrayRef<Value*> ops, const std::vector<Placement>& in,
                        const std::vector<Placement>& out, std::vector<Value*>& results) {
  AttrDict a = n.attrs();
  auto localOf = [&](const Value* v, const Placement& p) { return sharding::localShape(v->shape(), p, mesh_); };
  auto vec = [](const Shape& s) { return std::vector<int64_t>(s.begin(), s.end()); };
  auto offsetsOf = [&](const Shape& global, const Placement& p) {
    std::vector<int64_t> off(global.size(), 0);
    Shape l = sharding::localShape(global, p, mesh_);
    for (const MeshAxis& ax : mesh_.axes) {
      AP ap = p.get(ax.name);
      if (ap.isS()) off[ap.dim] = coord(ax.name) * l[ap.dim];
    }
    return off;
  };
  bool anyS = false;
  for (const auto& [ax, ap] : out[0].axes) anyS |= ap.isS();
  switch (n.op()) {
    case OpKind::Reshape:
    case OpKind::BroadcastTo:
    case OpKind::Full:
      a.set("shape", vec(localOf(n.result(), out[0])));
      break;
    case OpKind::Dropout:
      if (anyS) placeRandomShard(a, vec(n.result()->shape()), offsetsOf(n.result()->shape(), out[0]));
      break;
    case OpKind::Attention:
    case OpKind::AttentionGrad: {
      const Value* q = n.op() == OpKind::Attention ? n.operand(0) : n.operand(1);
      const Placement& qp = in[n.op() == OpKind::Attention ? 0 : 1];
      bool split = false;
      for (const auto& [ax, ap] : qp.axes) split |= ap.isS();
      if (split) {
        auto off = offsetsOf(q->shape(), qp);
        placeRandomShard(a, {q->shape()[0], q->shape()[1]}, {off[0], off[1]});
      }
      break;
    }
    case OpKind::Embedding:
      for (const MeshAxis& ax : mesh_.axes)
        if (in[0].get(ax.name).isS() && in[0].get(ax.name).dim == 0)
          a.set("vocab_start", n.getInt("vocab_start") + coord(ax.name) * localOf(n.operand(0), in[0])[0]);
      break;
    case OpKind::EmbeddingGrad:
      for (const MeshAxis& ax : mesh_.axes)
        if (out[0].get(ax.name).isS() && out[0].get(ax.name).dim == 0) {
          int64_t vl = localOf(n.result(), out[0])[0];
          a.set("vocab", vl);
          a.set("vocab_start", n.getInt("vocab_start") + coord(ax.name) * vl);
        }
      break;
    default: break;
  }
  TPC_ASSIGN(Node * ln, local_->create(n.op(), ops, std::move(a)));
  for (unsigned r = 0; r < n.numResults(); ++r) results.push_back(ln->result(r));
  if (n.op() == OpKind::ReduceMean) {  // a mean over split dims: each rank's mean weighted by its share
    double l = double(ln->operand(0)->type().numel()) / double(std::max<int64_t>(1, ln->result()->type().numel()));
    double gcount = double(n.operand(0)->type().numel()) / double(std::max<int64_t>(1, n.result()->type().numel()));
    if (l != gcount) {
      TPC_ASSIGN(results[0], emit(OpKind::Scale, {results[0]}, attrs({{"factor", l / gcount}})));
    }
  }
  for (unsigned r = 0; r < n.numResults(); ++r) {
    Shape want = localOf(n.result(r), out[r]);
    TPC_ASSERT_GRAPH(*local_, results[r]->shape() == want,
                     "partition: local " + std::string(n.opName()) + " result " + std::to_string(r) + " is " +
                         results[r]->type().str() + ", expected " + shapeStr(want) + " under " + out[r].str());
  }
  return {};
}

// cross_entropy(_grad) on logits split on the class dim along `axis`: the vocab-parallel loss, never the
// full logits. The forward's (global max, global sum exp) are reused by the backward.
Status Sweep::emitVocabParallel(const Node& n, const std::string& axis, llvm::ArrayRef<Value*> ops) {
  bool grad = n.op() == OpKind::CrossEntropyGrad;
  const Value* logitsG = n.operand(grad ? 1 : 0);
  Value* L = ops[grad ? 1 : 0];
  Value* T = ops[grad ? 2 : 1];
  int64_t vl = L->shape().back(), start = coord(axis) * vl;
  int64_t classes = n.getInt("num_classes") > 0 ? n.getInt("num_classes") : logitsG->shape().back();
  int64_t ignore = n.getInt("ignore_index");
  auto& stats = vocabStats_[logitsG];
  if (!stats.first) {
    TPC_ASSIGN(Value * m, emit(OpKind::VocabMax, {L}, attrs({{"vocab_start", start}, {"num_classes", classes}})));
    TPC_ASSIGN(Value * gm, emit(OpKind::AllReduce, {m}, attrs({{"axis", axis}, {"op", "max"}})));
    TPC_ASSIGN(Value * se, emit(OpKind::VocabSumExp, {L, gm}, attrs({{"vocab_start", start}, {"num_classes", classes}})));
    TPC_ASSIGN(Value * gse, emit(OpKind::AllReduce, {se}, attrs({{"axis", axis}, {"op", "sum"}})));
    stats = {gm, gse};
  }
  Value* out = nullptr;
  if (!grad) {
    TPC_ASSIGN(Value * pk, emit(OpKind::VocabPick, {L, T}, attrs({{"vocab_start", start}, {"ignore_index", ignore}})));
    TPC_ASSIGN(Value * gpk, emit(OpKind::AllReduce, {pk}, attrs({{"axis", axis}, {"op", "sum"}})));
    TPC_ASSIGN(out, emit(OpKind::VocabLoss, {stats.first, stats.second, gpk, T}, attrs({{"ignore_index", ignore}})));
  } else {
    TPC_ASSIGN(out, emit(OpKind::VocabXentGrad, {ops[0], L, stats.first, stats.second, T},
                         attrs({{"vocab_start", start}, {"num_classes", classes}, {"ignore_index", ignore}})));
  }
  cur_[n.result()].local = out;
  return {};
}

// global_norm over grads of mixed placements: every grad's sum of squares counted once. Grads split along
// the same set of axes are summed locally, then all_reduced along those axes; replicated ones are not.
Status Sweep::visitGlobalNorm(const Node& n, const std::vector<Placement>& need) {
  std::vector<Value*> ops;
  for (unsigned i = 0; i < n.numOperands(); ++i) {
    TPC_ASSIGN(Value * x, convert(n.operand(i), need[i]));
    ops.push_back(x);
  }
  Placement out = allR(mesh_);
  cur_[n.result()] = Cur{out, nullptr};
  placed[n.result()] = out;
  if (!emitting()) return {};
  std::map<std::vector<std::string>, std::vector<Value*>> groups;
  for (unsigned i = 0; i < n.numOperands(); ++i) {
    std::vector<std::string> axes;
    for (const MeshAxis& a : mesh_.axes)
      if (need[i].get(a.name).isS()) axes.push_back(a.name);
    groups[axes].push_back(ops[i]);
  }
  Value* total = nullptr;
  for (auto& [axes, vals] : groups) {
    TPC_ASSIGN(Value * s, emit(OpKind::SumSquares, vals, {}));
    for (const std::string& a : axes) {
      TPC_ASSIGN(s, emit(OpKind::AllReduce, {s}, attrs({{"axis", a}, {"op", "sum"}})));
    }
    if (total) {
      TPC_ASSIGN(total, emit(OpKind::Add, {total, s}, {}));
    } else {
      total = s;
    }
  }
  TPC_ASSIGN(Value * norm, emit(OpKind::Sqrt, {total}, {}));
  cur_[n.result()].local = norm;
  return {};
}

Status Sweep::visit(const Node& n) {
  std::vector<Placement> need(n.numOperands()), out(n.numResults());
  std::string vocabAxis;
  std::set<int64_t> usedIn, usedOut;  // split dims already taken by an earlier axis (one axis per dim)
  for (const MeshAxis& ax : mesh_.axes) {
    llvm::SmallVector<AP, 6> in;
    for (const Value* v : n.operands()) in.push_back(freeParams_.count(v) ? AP::replicated() : cur_.at(v).pl.get(ax.name));
    std::vector<AxisStrategy> cands = sharding::axisCandidates(n, in, ax.size);
    AxisStrategy r;
    r.in.assign(n.numOperands(), AP::replicated());
    r.out.assign(n.numResults(), AP::replicated());
    cands.push_back(r);
    // The cheapest strategy that keeps every placed param in place, or the cheapest at all if none does.
    const AxisStrategy* best = nullptr;
    int64_t bestCost = 0;
    bool bestMoves = false;
    for (const AxisStrategy& s : cands) {
      bool clash = false;
      for (unsigned i = 0; i < s.in.size(); ++i) clash |= s.in[i].isS() && usedIn.count(i * 64 + s.in[i].dim);
      for (unsigned i = 0; i < s.out.size(); ++i) clash |= s.out[i].isS() && usedOut.count(i * 64 + s.out[i].dim);
      if (clash) continue;
      int64_t c = 0;
      bool moves = false;
      for (unsigned i = 0; i < s.in.size(); ++i) {
        c += cost(n.operand(i), ax.name, s.in[i]);
        moves |= movesParam(n.operand(i), ax.name, s.in[i]);
      }
      // A hinted result (a policy's annotation) costs the move from the strategy's result to the hint.
      for (unsigned i = 0; i < s.out.size(); ++i)
        if (const auto& h = n.result(i)->placement(); h && names(*h, ax.name) && h->get(ax.name) != s.out[i])
          c += axisCost(n.result(i), s.out[i], h->get(ax.name));
      if (!best || moves < bestMoves || (moves == bestMoves && c < bestCost)) best = &s, bestCost = c, bestMoves = moves;
    }
    for (unsigned i = 0; i < best->in.size(); ++i) {
      need[i].set(ax.name, best->in[i]);
      if (best->in[i].isS()) usedIn.insert(i * 64 + best->in[i].dim);
    }
    for (unsigned i = 0; i < best->out.size(); ++i) {
      out[i].set(ax.name, best->out[i]);
      if (best->out[i].isS()) usedOut.insert(i * 64 + best->out[i].dim);
    }
    if (best->vocabParallel) vocabAxis = ax.name;
  }
  for (auto& p : need) p = canonical(p, mesh_);
  for (auto& p : out) p = canonical(p, mesh_);
  if (n.op() == OpKind::GlobalNorm) return visitGlobalNorm(n, need);

  std::vector<Value*> ops;
  for (unsigned i = 0; i < n.numOperands(); ++i) {
    TPC_ASSIGN(Value * x, convert(n.operand(i), need[i]));
    ops.push_back(x);
  }
  for (unsigned r = 0; r < n.numResults(); ++r) cur_[n.result(r)] = Cur{out[r], nullptr};
  if (emitting()) {
    if (!vocabAxis.empty()) {
      TPC_TRY(emitVocabParallel(n, vocabAxis, ops));
    } else {
      std::vector<Value*> results;
      TPC_TRY(emitLocal(n, ops, need, out, results));
      for (unsigned r = 0; r < n.numResults(); ++r) {
        cur_[n.result(r)].local = results[r];
        if (n.result(r)->hasName()) results[r]->setName(n.result(r)->name());
      }
    }
  }
  for (unsigned r = 0; r < n.numResults(); ++r) {
    placed[n.result(r)] = out[r];
    const auto& hint = n.result(r)->placement();
    if (!hint) continue;
    Placement want = out[r];
    for (const MeshAxis& ax : mesh_.axes)
      if (names(*hint, ax.name)) want.set(ax.name, hint->get(ax.name));
    want = canonical(want, mesh_);
    if (want == out[r]) continue;
    TPC_ASSIGN(Value * x, convert(n.result(r), want));
    cur_[n.result(r)] = Cur{want, x};
    placed[n.result(r)] = want;
  }
  return {};
}

Status Sweep::run() {
  auto addArg = [&](const Value* v, bool param) {
    Placement p = v->placement() ? canonical(*v->placement(), mesh_) : allR(mesh_);
    if (param && !v->placement() && !emitting()) freeParams_.insert(v);
    Value* l = nullptr;
    if (emitting()) {
      TensorType t(v->dtype(), sharding::localShape(v->shape(), p, mesh_));
      l = param ? local_->addParam(v->name(), t, v->init()) : local_->addInput(v->name(), t);
      l->setPlacement(p);
    }
    cur_[v] = Cur{p, l};
    placed[v] = p;
  };
  for (const Value* v : g_.inputs()) addArg(v, false);
  for (const Value* v : g_.params()) addArg(v, true);
  paramViews_.insert(g_.params().begin(), g_.params().end());
  for (const Node* n : g_.nodes()) {
    bool view = n->numOperands() > 0;
    for (const Value* o : n->operands()) view &= paramViews_.count(o) > 0;
    if (view) paramViews_.insert(n->results().begin(), n->results().end());
  }
  for (Node* n : g_.nodes()) TPC_TRY(visit(*n));
  // Outputs: a param's update keeps the param's placement (the runtime gathers it); the rest is whole.
  std::map<std::string, const Value*> params;
  for (const Value* v : g_.params()) params[v->name()] = v;
  for (size_t i = 0; i < g_.outputs().size(); ++i) {
    const Value* v = g_.outputs()[i].value;
    auto it = params.find(g_.outputName(i));
    Placement want = it != params.end() ? placed[it->second] : allR(mesh_);
    if (freeParams_.count(v)) want = allR(mesh_);
    TPC_ASSIGN(Value * x, convert(v, want));
    if (emitting()) local_->addOutput(x, g_.outputs()[i].name.empty() ? g_.outputName(i) : g_.outputs()[i].name);
  }
  for (const Value* v : freeParams_) placed[v] = allR(mesh_);
  if (emitting()) {
    for (const Value* p : g_.params()) {  // params adopted on first use got their final local type there
      (void)p;
    }
  }
  return {};
}

// Every placement given splits its dims into equal blocks: a dim the axes splitting it do not divide has no rank
// layout (partition would lose rows or abort).
Status checkEvenSplits(const Graph& g) {
  auto check = [&](const Value* v) -> Status {
    if (!v->placement()) return {};
    for (int64_t d = 0; d < v->type().rank(); ++d) {
      int64_t ways = 1;
      std::string axes;
      for (const auto& [axis, ap] : v->placement()->axes)
        if (ap.isS() && ap.dim == d) {
          ways *= g.mesh().axisSize(axis);
          axes += cat(axes.empty() ? "" : " x ", axis, "=", g.mesh().axisSize(axis));
        }
      if (ways > 1 && v->shape()[d] % ways != 0)
        return makeError("the placement ", v->placement()->str(), " of ", v->ref(), " ", v->type().str(),
                         " splits dim ", d, " (", v->shape()[d], ") over ", axes, ", which does not divide it; place it "
                         "so that each split dim divides evenly, or leave that axis R");
    }
    return {};
  };
  for (const Value* v : g.inputs()) TPC_TRY(check(v));
  for (const Value* v : g.params()) TPC_TRY(check(v));
  for (const Node* n : g.nodes())
    for (const Value* r : n->results()) TPC_TRY(check(r));
  return {};
}

}  // namespace

Status propagatePlacements(Graph& g) {
  if (g.mesh().empty()) return {};
  TPC_TRY(checkEvenSplits(g));
  TPC_TRY(foldPaddedVocabSlices(g).status());
  Sweep s(g, -1);
  TPC_TRY(s.run());
  for (const Value* cv : g.inputs()) const_cast<Value*>(cv)->setPlacement(s.placed[cv]);
  for (const Value* cv : g.params()) const_cast<Value*>(cv)->setPlacement(s.placed[cv]);
  for (Node* n : g.nodes())
    for (Value* r : n->results()) r->setPlacement(s.placed[r]);
  return {};
}

Result<std::unique_ptr<Graph>> partitionForRank(const Graph& annotated, int64_t rank) {
  if (rank < 0 || rank >= std::max<int64_t>(1, annotated.mesh().numRanks()))
    return makeError("partition: rank ", rank, " is outside ", annotated.mesh().str(), " (",
                     annotated.mesh().numRanks(), " ranks)");
  for (const Value* p : annotated.params())
    if (!p->placement() && !annotated.mesh().empty())
      return makeError("partition: param ", p->name(), " has no placement; run propagation first");
  TPC_TRY(checkEvenSplits(annotated));
  Sweep s(annotated, rank);
  TPC_TRY(s.run());
  std::unique_ptr<Graph> local = std::move(s.local_);
  foldSlicedEmbeddingGrads(*local);
  foldZeroShareAdds(*local, s.zeroShares);
  foldStackedQkv(*local);
  // Emitted but unused (e.g. a gather a later rule made unnecessary): drop.
  bool changed = true;
  while (changed) {
    changed = false;
    auto u = local->computeUsers();
    for (Node* n : local->nodeVector()) {
      bool dead = true;
      for (Value* r : n->results()) dead &= u.lookup(r).empty() && !local->isOutput(r);
      if (dead) {
        local->erase(n);
        changed = true;
      }
    }
  }
  return local;
}

Status annotatePlacement(Value* v, const std::string& axis, AxisPlacement p, const std::string& policy) {
  Placement pl = v->placement() ? *v->placement() : Placement{};
  for (const auto& [a, ap] : pl.axes)
    if (a == axis && ap != p)
      return makeError(policy, ": tensor ", v->name(), " ", v->type().str(), " is already placed ", ap.str(),
                       " on mesh axis ", axis, " by another policy; ", policy, " wants ", p.str());
  pl.set(axis, p);
  v->setPlacement(pl);
  return {};
}

Status checkNotPartitioned(const Graph& g, const std::string& pass) {
  for (const Node* n : g.nodes())
    if (n->has(traits::Collective))
      return makeError(pass, ": the graph holds collectives (", n->opName(), "), which partition inserts: it is one rank's "
                       "program already (its shapes are the rank's blocks); run ", pass, " on the graph partition takes "
                       "(e.g. tpc dump --after=dce), not on what it gave");
  return {};
}

Status ensureMeshAxis(Graph& g, const std::string& name, int64_t size, const std::string& policy) {
  if (size < 1) return makeError(policy, ": mesh axis ", name, "=", size, " must be >= 1");
  TPC_TRY(checkNotPartitioned(g, policy));
  Mesh m = g.mesh();
  int idx = m.axisIndex(name);
  if (idx >= 0) {
    if (m.axes[idx].size != size)
      return makeError(policy, ": the graph's ", m.str(), " has ", name, "=", m.axes[idx].size, " but ", policy,
                       " asks for ", name, "=", size);
    return {};
  }
  // dp outermost, tp innermost (tp ranks are neighbours, like Megatron).
  if (name == "dp") m.axes.insert(m.axes.begin(), MeshAxis{name, size});
  else m.axes.push_back(MeshAxis{name, size});
  g.setMesh(m);
  return {};
}

Result<std::vector<std::unique_ptr<Graph>>> partitionRanks(Graph& g, std::optional<int64_t> onlyRank) {
  TPC_TRY(propagatePlacements(g));
  std::vector<std::unique_ptr<Graph>> ranks;
  for (int64_t r = 0; r < g.mesh().numRanks(); ++r) {
    if (onlyRank && r != *onlyRank) continue;
    TPC_ASSIGN(auto local, partitionForRank(g, r));
    ranks.push_back(std::move(local));
  }
  return ranks;
}

}  // namespace tpc
