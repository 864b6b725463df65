// `megatron-tp(tp=N)`: Megatron tensor parallelism as annotations on the GPT's params. QKV and fc1 by column,
// attention by heads, proj and fc2 by row, the tied embedding / LM head by vocab; LN, wpe and the row-parallel
// biases replicated. Runs on the forward graph (before autodiff): the fused QKV matrix [D, 3D] is viewed as
// [D, 3, D] (same bytes, q/k/v blocks) so that a column split cuts each of q, k, v by heads, which needs the
// QKV projection rewritten as a batched matmul over the 3 blocks.
#include <regex>

#include "passes/builtin_passes.h"
#include "passes/sharding/sharding.h"

namespace tpc {
namespace {

const char* kPolicy = "megatron-tp";

Status splitParam(Value* p, int64_t dim, int64_t tp) {
  if (p->shape()[dim] % tp != 0)
    return makeError(kPolicy, ": tp=", tp, " does not divide dim ", dim, " (", p->shape()[dim], ") of tensor ", p->name(),
                     " ", p->type().str(), " on mesh axis tp");
  return annotatePlacement(p, "tp", AxisPlacement::split(dim), kPolicy);
}

// x @ W + b -> reshape [B,T,3,H,Dh] -> transpose [3,B,H,T,Dh]   becomes
// transpose(reshape(reshape(x,[B,1,T,D]) @ transpose(W[D,3,D]) + b[1,3,1,D], [B,3,T,H,Dh]), [1,0,3,2,4]).
Status rewriteFusedQkv(Graph& g, Value* W, Value* bias, int64_t tp) {
  auto users = g.computeUsers();
  auto only = [&](Value* v, OpKind op) -> Node* {
    const auto& u = users.lookup(v);
    return u.size() == 1 && u[0]->op() == op ? u[0] : nullptr;
  };
  Node* mm = only(W, OpKind::Matmul);
  if (!mm || mm->operand(1) != W || mm->getBool("transpose_a") || mm->getBool("transpose_b"))
    return makeError(kPolicy, ": tensor ", W->name(), " is not used as `matmul(x, ", W->name(),
                     ")` once; cannot split the fused QKV by heads");
  Node* add = only(mm->result(), OpKind::Add);
  Node* rs = add ? only(add->result(), OpKind::Reshape) : nullptr;
  Node* tr = rs ? only(rs->result(), OpKind::Transpose) : nullptr;
  const int64_t D = W->shape()[0];
  if (!add || (add->operand(1) != bias) || !tr || rs->result()->type().rank() != 5 || rs->result()->shape()[2] != 3 ||
      tr->getInts("perm") != std::vector<int64_t>{2, 0, 3, 1, 4})
    return makeError(kPolicy, ": tensor ", W->name(), ": expected x @ W + b reshaped to [B,T,3,H,Dh] and transposed "
                     "to [3,B,H,T,Dh] (the GPT builder's attention)");
  const Shape& hs = rs->result()->shape();
  int64_t B = hs[0], T = hs[1], H = hs[3], Dh = hs[4];
  if (H % tp != 0)
    return makeError(kPolicy, ": tp=", tp, " does not divide the ", H, " attention heads of tensor ", W->name(),
                     " on mesh axis tp");
  Value* x = mm->operand(0);
  W->setType(TensorType(W->dtype(), {D, 3, D}));
  bias->setType(TensorType(bias->dtype(), {3, D}));
  Node* at = tr;  // insert before the old transpose's position
  auto mk = [&](OpKind op, std::vector<Value*> ops, AttrDict a) -> Result<Value*> {
    TPC_ASSIGN(Node * n, g.create(op, ops, std::move(a), at));
    return n->result(0);
  };
  TPC_ASSIGN(Value * wt, mk(OpKind::Transpose, {W}, attrs({{"perm", std::vector<int64_t>{1, 0, 2}}})));
  TPC_ASSIGN(Value * xr, mk(OpKind::Reshape, {x}, attrs({{"shape", std::vector<int64_t>{B, 1, T, D}}})));
  TPC_ASSIGN(Value * y, mk(OpKind::Matmul, {xr, wt}, {}));
  TPC_ASSIGN(Value * br, mk(OpKind::Reshape, {bias}, attrs({{"shape", std::vector<int64_t>{1, 3, 1, D}}})));
  TPC_ASSIGN(Value * yb, mk(OpKind::Add, {y, br}, {}));
  TPC_ASSIGN(Value * y5, mk(OpKind::Reshape, {yb}, attrs({{"shape", std::vector<int64_t>{B, 3, T, H, Dh}}})));
  TPC_ASSIGN(Value * heads, mk(OpKind::Transpose, {y5}, attrs({{"perm", std::vector<int64_t>{1, 0, 3, 2, 4}}})));
  g.replaceAllUsesWith(tr->result(), heads);
  if (tr->result()->hasName()) heads->setName(tr->result()->name());
  for (Node* n : {tr, rs, add, mm}) g.erase(n);
  TPC_TRY(splitParam(W, 2, tp));
  TPC_TRY(splitParam(bias, 1, tp));
  return {};
}

class MegatronTpPass final : public Pass {
 public:
  explicit MegatronTpPass(int64_t tp) : tp_(tp) {}
  std::string_view name() const override { return kPolicy; }
  Result<bool> run(Graph& g) override {
    for (Node* n : g.nodes())
      if (n->op() == OpKind::AdamWUpdate)
        return makeError(kPolicy, ": run it before autodiff (it rewrites the fused QKV projection of the forward "
                         "graph so that a column split cuts q, k and v by heads)");
    TPC_TRY(ensureMeshAxis(g, "tp", tp_, kPolicy));
    std::map<std::string, Value*> params;
    for (Value* p : g.params()) params[p->name()] = p;
    if (!params.count("wte")) return makeError(kPolicy, ": the graph has no param 'wte': not a GPT built by tpc");
    static const std::regex layer(R"(h\.(\d+)\.attn\.c_attn\.weight)");
    for (Value* p : g.params()) {
      std::smatch m;
      std::string name = p->name();
      if (!std::regex_match(name, m, layer)) continue;
      std::string h = "h." + m[1].str();
      Value* bias = params[h + ".attn.c_attn.bias"];
      if (!bias) return makeError(kPolicy, ": tensor ", h, ".attn.c_attn.bias is missing");
      if (p->type().rank() == 2) TPC_TRY(rewriteFusedQkv(g, p, bias, tp_));
      for (auto [suffix, dim] : std::initializer_list<std::pair<const char*, int64_t>>{
               {".attn.c_proj.weight", 0}, {".mlp.c_fc.weight", 1}, {".mlp.c_fc.bias", 0}, {".mlp.c_proj.weight", 0}}) {
        Value* q = params[h + suffix];
        if (!q) return makeError(kPolicy, ": tensor ", h, suffix, " is missing");
        TPC_TRY(splitParam(q, dim, tp_));
      }
    }
    TPC_TRY(splitParam(params["wte"], 0, tp_));  // vocab parallel: embedding and the tied LM head
    for (Value* p : g.params())
      if (!p->placement()) TPC_TRY(annotatePlacement(p, "tp", AxisPlacement::replicated(), kPolicy));
    return true;
  }

 private:
  int64_t tp_;
};

}  // namespace

Result<std::unique_ptr<Pass>> createMegatronTpPass(const PassOptions& o) {
  TPC_ASSIGN(int64_t tp, o.getInt("tp", 0));
  if (!o.has("tp")) return makeError("pass 'megatron-tp': option tp is required (e.g. megatron-tp(tp=4))");
  if (tp < 1) return makeError("pass 'megatron-tp': option tp=", tp, " must be >= 1 (e.g. megatron-tp(tp=4))");
  std::unique_ptr<Pass> p = std::make_unique<MegatronTpPass>(tp);
  return p;
}

}  // namespace tpc
