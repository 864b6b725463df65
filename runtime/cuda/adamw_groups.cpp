// Grouping the adamw_update nodes of a step (adamw_groups.h).
#include "runtime/cuda/adamw_groups.h"

#include <algorithm>
#include <functional>
#include <map>
#include <string>
#include <tuple>

#include "runtime/backend.h"
#include "runtime/cuda/lowering.h"
#include "runtime/cuda/ordered_buckets.h"

namespace tpc::cuda {

bool isAdamWGroup(const FusionGroup& g) { return !g.members.empty() && g.members.front()->op() == OpKind::AdamWUpdate; }

bool adamwGroupKeepsCopies(const FusionGroup& g) { return g.outputs.size() == 4 * g.members.size(); }

std::vector<Value*> adamwGroupCopies(const FusionGroup& g) {
  std::vector<Value*> copies;
  if (adamwGroupKeepsCopies(g))
    for (size_t j = 0; j < g.members.size(); ++j) copies.push_back(g.outputs[4 * j + 3]);
  return copies;
}

bool adamwGroupScales(const FusionGroup& g) {
  return std::any_of(g.absorbed.begin(), g.absorbed.end(), [](const Node* n) { return n->op() == OpKind::Mul; });
}

size_t adamwGroupGates(const FusionGroup& g) {
  return g.inputs.size() - 4 * g.members.size() - 2 - (adamwGroupScales(g) ? 1 : 0);
}

namespace {

// What an adamw_update's kernel reads as its gradient: through mul(x, clip_scale) (f32, the clip multiply) and
// then cast(y) {to=f32} (an exact widening of a bf16/f16 gradient), when nothing else reads them and no
// fusion group computes them. The group's kernel then does `float(y) * scale` itself, the same f32 multiply.
struct GradSource {
  Value* grad = nullptr;   // what the kernel loads
  Value* scale = nullptr;  // the clip scale it multiplies by, or null
  std::vector<Node*> absorbed;
};

GradSource gradSource(const Graph& g, Node& update, const llvm::DenseMap<const Value*, llvm::SmallVector<Node*, 4>>& users,
                      const llvm::DenseMap<const Node*, const FusionGroup*>* fused) {
  GradSource s;
  s.grad = update.operand(1);
  auto onlyReader = [&](const Value* v, const Node* reader) {
    auto u = users.find(v);
    return !g.isOutput(v) && u != users.end() && u->second.size() == 1 && u->second[0] == reader && v->def() &&
           !(fused && fused->lookup(v->def())) && fusionGroupOf(*v->def()) < 0;
  };
  Node* mul = s.grad->def();
  if (!mul || mul->op() != OpKind::Mul || s.grad->dtype() != DType::f32 || !onlyReader(s.grad, &update)) return s;
  for (unsigned k = 0; k < 2; ++k) {
    Value* sc = mul->operand(k);
    Value* x = mul->operand(1 - k);
    if (!sc->def() || sc->def()->op() != OpKind::ClipScale || x->type() != s.grad->type()) continue;
    s.grad = x;
    s.scale = sc;
    s.absorbed.push_back(mul);
    Node* c = x->def();
    if (c && c->op() == OpKind::Cast && onlyReader(x, mul) &&
        (c->operand(0)->dtype() == DType::bf16 || c->operand(0)->dtype() == DType::f16)) {
      s.grad = c->operand(0);
      s.absorbed.push_back(c);
    }
    break;
  }
  return s;
}

// The 16-bit copy update's kernel can keep: the result of a cast of its parameter p (f32) to bf16/f16, as a
// cast group takes it (castGroups: in no fusion group), when its p' is the step's output named p (the next
// step's p; `next`: each output's value by name). Null when there is none.
Value* sixteenBitCopy(const Node& update, const std::map<std::string, const Value*>& next,
                      const llvm::DenseMap<const Value*, llvm::SmallVector<Node*, 4>>& users,
                      const llvm::DenseMap<const Node*, const FusionGroup*>* fused) {
  const Value* p = update.operand(0);
  auto n = next.find(p->name());
  auto u = users.find(p);
  if (!p->isParam() || p->dtype() != DType::f32 || n == next.end() || n->second != update.result(0) || u == users.end())
    return nullptr;
  for (Node* c : u->second) {
    if (c->op() != OpKind::Cast || fusionGroupOf(*c) >= 0 || (fused && fused->lookup(c))) continue;
    if (c->result()->dtype() == DType::bf16 || c->result()->dtype() == DType::f16) return c->result();
  }
  return nullptr;
}

}  // namespace

std::vector<FusionGroup> adamwGroups(const Graph& g, const llvm::DenseMap<const Node*, const FusionGroup*>* fused,
                                     bool sixteenBitCopies) {
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
  // The copy's dtype is in the key: a group keeps a copy for every member or for none.
  using Key = std::tuple<std::vector<DType>, double, double, double, const Value*, const Value*, const Value*, int>;
  OrderedBuckets<Key> buckets;
  llvm::DenseMap<const Node*, GradSource> sources;
  llvm::DenseMap<const Node*, Value*> copies;
  std::map<std::string, const Value*> outputs;
  for (size_t i = 0; sixteenBitCopies && i < g.outputs().size(); ++i) outputs[g.outputName(i)] = g.outputs()[i].value;
  for (Node* n : nodes) {
    if (n->op() != OpKind::AdamWUpdate) continue;
    bool read = false;
    for (Value* r : n->results()) read |= users.count(r) && !users.find(r)->second.empty();
    if (read) continue;
    GradSource src = gradSource(g, *n, users, fused);
    std::vector<DType> dtypes;
    for (unsigned k = 0; k < 4; ++k) dtypes.push_back(k == 1 ? src.grad->dtype() : n->operand(k)->dtype());
    for (Value* r : n->results()) dtypes.push_back(r->dtype());
    Value* copy = sixteenBitCopies ? sixteenBitCopy(*n, outputs, users, fused) : nullptr;
    if (copy) copies[n] = copy;
    buckets.add(Key{dtypes, n->getFloat("beta1"), n->getFloat("beta2"), n->getFloat("eps"), n->operand(4), n->operand(5), src.scale,
                    copy ? static_cast<int>(copy->dtype()) : -1},
                n);
    sources[n] = std::move(src);
  }
  std::vector<FusionGroup> groups;
  for (std::vector<Node*>& members : buckets.buckets()) {
    int at = index.lookup(members.back());
    bool gated = true;
    for (Value* v : gates) {
      DType t = v->dtype();
      gated &= ready(v) < at && (t == DType::f32 || t == DType::bf16 || t == DType::f16);  // what the kernel reads
    }
    if (!gated) continue;
    Value* scale = sources[members.front()].scale;  // read by the absorbed multiplies, so ready before the group
    FusionGroup fg;
    fg.members = members;
    for (Node* n : members) {
      const GradSource& src = sources[n];
      for (unsigned k = 0; k < 4; ++k) fg.inputs.push_back(k == 1 ? src.grad : n->operand(k));
      for (Value* r : n->results()) fg.outputs.push_back(r);
      if (Value* c = copies.lookup(n)) fg.outputs.push_back(c);
      fg.absorbed.insert(fg.absorbed.end(), src.absorbed.begin(), src.absorbed.end());
    }
    fg.inputs.push_back(members.front()->operand(4));
    fg.inputs.push_back(members.front()->operand(5));
    if (scale) fg.inputs.push_back(scale);
    fg.inputs.insert(fg.inputs.end(), gates.begin(), gates.end());
    groups.push_back(std::move(fg));
  }
  return groups;
}

}  // namespace tpc::cuda
