// One small graph per op of ops.def (several for ops with variants: broadcasting, dtypes, transposes,
// sharded random ops), with the value range of every input. Shared by the CI test that lowers every op
// and compiles every generated kernel with NVRTC (no GPU needed) and by the GPU test that runs each on the
// GPU against the CPU backend.
#pragma once

#include <memory>
#include <random>
#include <string>
#include <vector>

#include "ir/graph.h"
#include "runtime/backend.h"

namespace tpc::testing {

struct InputSpec {
  std::string name;
  TensorType type;
  double lo = -1, hi = 1;  // uniform; integers in [lo, hi)
};

struct OpCase {
  std::string label;
  OpKind op;
  std::vector<InputSpec> inputs;  // the node's operands, in order
  AttrDict attrs;
  Mesh mesh;  // for collectives
};

inline TensorType f32(Shape s) { return TensorType(DType::f32, std::move(s)); }

inline std::vector<OpCase> cudaOpCases() {
  std::vector<OpCase> c;
  auto x = [](Shape s, double lo = -1, double hi = 1, DType t = DType::f32) { return InputSpec{"x", TensorType(t, s), lo, hi}; };
  auto in = [](const char* n, TensorType t, double lo = -1, double hi = 1) { return InputSpec{n, std::move(t), lo, hi}; };
  for (OpKind op : {OpKind::Neg, OpKind::Exp, OpKind::Tanh, OpKind::Gelu}) {
    c.push_back({"f32[4,5]", op, {x({4, 5})}, {}, {}});
    c.push_back({"bf16[7]", op, {x({7}, -1, 1, DType::bf16)}, {}, {}});
  }
  for (OpKind op : {OpKind::Log, OpKind::Sqrt, OpKind::Rsqrt}) c.push_back({"f32[3,33]", op, {x({3, 33}, 0.5, 2)}, {}, {}});
  c.push_back({"f32[4,5]", OpKind::Scale, {x({4, 5})}, {}, {}});
  c.back().attrs.set("factor", 0.37);
  for (auto [from, to] : {std::pair{DType::f32, DType::bf16}, {DType::bf16, DType::f32}, {DType::f32, DType::f16},
                          {DType::f16, DType::f32}, {DType::f32, DType::i32}, {DType::i32, DType::f32}, {DType::i32, DType::i64}}) {
    c.push_back({cat(dtypeName(from), "->", dtypeName(to)), OpKind::Cast, {x({6, 7}, -50, 50, from)}, {}, {}});
    c.back().attrs.set("to", to);
  }
  c.push_back({"p=0.1", OpKind::Dropout, {x({8, 33})}, {}, {}});
  c.back().attrs.set("p", 0.1);
  c.back().attrs.set("key", int64_t(3));
  c.push_back({"p=0.25 sharded", OpKind::Dropout, {x({4, 5})}, {}, {}});
  c.back().attrs.set("p", 0.25);
  c.back().attrs.set("key", int64_t(9));
  c.back().attrs.set("global_shape", std::vector<int64_t>{8, 10});
  c.back().attrs.set("offsets", std::vector<int64_t>{4, 5});
  for (OpKind op : {OpKind::Add, OpKind::Sub, OpKind::Mul, OpKind::Div}) {
    c.push_back({"same", op, {in("a", f32({4, 5})), in("b", f32({4, 5}), 0.5, 2)}, {}, {}});
    c.push_back({"row", op, {in("a", f32({3, 4, 5})), in("b", f32({5}), 0.5, 2)}, {}, {}});
    c.push_back({"outer", op, {in("a", f32({4, 1})), in("b", f32({1, 5}), 0.5, 2)}, {}, {}});
    c.push_back({"scalar", op, {in("a", f32({2, 3})), in("b", f32({}), 0.5, 2)}, {}, {}});
  }
  c.push_back({"i32", OpKind::Add, {in("a", TensorType(DType::i32, {4, 5}), -9, 9), in("b", TensorType(DType::i32, {5}), -9, 9)}, {}, {}});
  c.push_back({"f32", OpKind::GeluGrad, {in("dy", f32({4, 33})), in("x", f32({4, 33}), -3, 3)}, {}, {}});
  // Lone nodes whose sizes take the fused kernel's 16-byte vector path (CudaOptions: LoweringContext::vectorElementwise).
  TensorType bfv(DType::bf16, {6, 64});
  c.push_back({"bf16 vector", OpKind::GeluGrad, {in("dy", bfv), in("x", bfv, -3, 3)}, {}, {}});
  c.push_back({"f32 vector", OpKind::GeluGrad, {in("dy", f32({4, 32})), in("x", f32({4, 32}), -3, 3)}, {}, {}});
  c.push_back({"bf16 vector, bias", OpKind::Add, {in("a", bfv), in("b", TensorType(DType::bf16, {64}))}, {}, {}});
  // Normalization, softmax, loss.
  c.push_back({"[6,48]", OpKind::LayerNorm, {x({6, 48}), in("g", f32({48})), in("b", f32({48}))}, {}, {}});
  c.push_back({"[6,48]", OpKind::LayerNormGrad, {in("dy", f32({6, 48})), x({6, 48}), in("g", f32({48}))}, {}, {}});
  c.push_back({"[6,48] residual", OpKind::LayerNormGrad,
               {in("dy", f32({6, 48})), x({6, 48}), in("g", f32({48})), in("r", f32({6, 48}))}, {}, {}});
  c.push_back({"[5,37]", OpKind::Softmax, {x({5, 37}, -3, 3)}, {}, {}});
  c.push_back({"[5,37]", OpKind::SoftmaxGrad, {in("dy", f32({5, 37})), in("y", f32({5, 37}), 0, 0.2)}, {}, {}});
  auto ids = [](const char* n, Shape s, double hi, double lo = 0) { return InputSpec{n, TensorType(DType::i32, s), lo, hi}; };
  c.push_back({"[2,3,40]", OpKind::CrossEntropy, {in("logits", f32({2, 3, 40}), -3, 3), ids("t", {2, 3}, 40, -1)}, {}, {}});
  c.push_back({"padded", OpKind::CrossEntropy, {in("logits", f32({6, 40}), -3, 3), ids("t", {6}, 37)}, {}, {}});
  c.back().attrs.set("num_classes", int64_t(37));
  c.push_back({"[6,40]", OpKind::CrossEntropyGrad,
               {in("dl", f32({6})), in("logits", f32({6, 40}), -3, 3), ids("t", {6}, 40, -1)}, {}, {}});
  c.push_back({"[6,40] padded", OpKind::CrossEntropyWithGrad,
               {in("dl", f32({6})), in("logits", f32({6, 40}), -3, 3), ids("t", {6}, 37, -1)}, {}, {}});
  c.back().attrs.set("num_classes", int64_t(37));
  auto vocab = [](OpCase k) {
    k.attrs.set("vocab_start", int64_t(40));
    return k;
  };
  c.push_back(vocab({"shard 1", OpKind::VocabMax, {in("logits", f32({6, 40}), -3, 3)}, {}, {}}));
  c.back().attrs.set("num_classes", int64_t(70));
  c.push_back(vocab({"shard 1", OpKind::VocabSumExp, {in("logits", f32({6, 40}), -3, 3), in("gmax", f32({6}), 2, 3)}, {}, {}}));
  c.back().attrs.set("num_classes", int64_t(70));
  c.push_back(vocab({"shard 1", OpKind::VocabPick, {in("logits", f32({6, 40}), -3, 3), ids("t", {6}, 80, -1)}, {}, {}}));
  c.push_back({"[6]", OpKind::VocabLoss,
               {in("gmax", f32({6}), 2, 3), in("se", f32({6}), 1, 9), in("picked", f32({6})), ids("t", {6}, 80, -1)}, {}, {}});
  c.push_back(vocab({"shard 1", OpKind::VocabXentGrad,
                     {in("dl", f32({6})), in("logits", f32({6, 40}), -3, 3), in("gmax", f32({6}), 2, 3),
                      in("se", f32({6}), 20, 40), ids("t", {6}, 80, -1)}, {}, {}}));
  c.back().attrs.set("num_classes", int64_t(70));
  // Contractions.
  c.push_back({"[4,8]x[8,5]", OpKind::Matmul, {in("a", f32({4, 8})), in("b", f32({8, 5}))}, {}, {}});
  c.push_back({"a^T b^T", OpKind::Matmul, {in("a", f32({8, 4})), in("b", f32({5, 8}))}, {}, {}});
  c.back().attrs.set("transpose_a", true);
  c.back().attrs.set("transpose_b", true);
  c.push_back({"batched", OpKind::Matmul, {in("a", f32({2, 3, 4, 8})), in("b", f32({2, 3, 8, 5}))}, {}, {}});
  c.push_back({"b 2-D", OpKind::Matmul, {in("a", f32({3, 4, 8})), in("b", f32({8, 5}))}, {}, {}});
  c.push_back({"broadcast batch [4,1] x [3]", OpKind::Matmul, {in("a", f32({4, 1, 6, 8})), in("b", f32({3, 8, 5}))}, {}, {}});
  c.push_back({"a^T batched, b 2-D", OpKind::Matmul, {in("a", f32({3, 8, 4})), in("b", f32({8, 5}))}, {}, {}});
  c.back().attrs.set("transpose_a", true);
  // cuBLASLt epilogues (N divisible by 8: the gelu input's leading dimension).
  auto epi = [&](const char* e, std::vector<InputSpec> ins, bool ta = false) {
    c.push_back({e, OpKind::MatmulEpilogue, std::move(ins), {}, {}});
    c.back().attrs.set("epilogue", std::string(e));
    if (ta) c.back().attrs.set("transpose_a", true);
  };
  epi("bias", {in("a", f32({2, 4, 8})), in("b", f32({8, 16})), in("bias", f32({16}))});
  c.back().label = "bias, residual";
  c.back().inputs.push_back(in("res", f32({2, 4, 16})));
  epi("bias", {in("a", f32({2, 4, 8})), in("b", f32({16, 8})), in("bias", f32({16}))});
  c.back().label = "bias, b^T";
  c.back().attrs.set("transpose_b", true);
  epi("gelu_bias", {in("a", f32({2, 4, 8})), in("b", f32({8, 16})), in("bias", f32({16}), -2, 2)});
  epi("dgelu", {in("a", f32({8, 8})), in("b", f32({16, 8})), in("pre", f32({8, 16}), -3, 3)});
  c.back().attrs.set("transpose_b", true);
  epi("dgelu_bgrad", {in("a", f32({2, 4, 8})), in("b", f32({8, 16})), in("pre", f32({2, 4, 16}), -3, 3)});
  epi("bgrad_b", {in("a", f32({12, 8})), in("b", f32({12, 16}))}, true);
  c.push_back({"[2,2,16,8]", OpKind::Attention, {in("q", f32({2, 2, 16, 8})), in("k", f32({2, 2, 16, 8})), in("v", f32({2, 2, 16, 8}))}, {}, {}});
  c.push_back({"[2,2,16,8]", OpKind::AttentionGrad,
               {in("dout", f32({2, 2, 16, 8})), in("q", f32({2, 2, 16, 8})), in("k", f32({2, 2, 16, 8})),
                in("v", f32({2, 2, 16, 8})), in("out", f32({2, 2, 16, 8})), in("lse", f32({2, 2, 16}), 2, 3)}, {}, {}});
  c.push_back({"[2,16,3,2,8]", OpKind::AttentionQkv, {in("qkv", f32({2, 16, 3, 2, 8}))}, {}, {}});
  c.push_back({"[2,16,3,2,8]", OpKind::AttentionQkvGrad,
               {in("dout", f32({2, 16, 2, 8})), in("qkv", f32({2, 16, 3, 2, 8})), in("out", f32({2, 16, 2, 8})),
                in("lse", f32({2, 2, 16}), 2, 3)}, {}, {}});
  for (size_t k = c.size() - 2; k < c.size(); ++k) c[k].attrs.set("perm", std::vector<int64_t>{2, 0, 3, 1, 4});
  c.push_back({"[50,16]", OpKind::Embedding, {in("table", f32({50, 16})), ids("ids", {4, 5}, 50)}, {}, {}});
  c.push_back({"[4,5,16]", OpKind::EmbeddingGrad, {in("dy", f32({4, 5, 16})), ids("ids", {4, 5}, 50)}, {}, {}});
  c.back().attrs.set("vocab", int64_t(50));
  // Movement.
  c.push_back({"[4,5]->[20]", OpKind::Reshape, {x({4, 5})}, {}, {}});
  c.back().attrs.set("shape", std::vector<int64_t>{20});
  c.push_back({"[2,3,4] (2,0,1)", OpKind::Transpose, {x({2, 3, 4})}, {}, {}});
  c.back().attrs.set("perm", std::vector<int64_t>{2, 0, 1});
  c.push_back({"axis 1 [1,3)", OpKind::Slice, {x({4, 5})}, {}, {}});
  c.back().attrs.set("axis", int64_t(1));
  c.back().attrs.set("start", int64_t(1));
  c.back().attrs.set("end", int64_t(3));
  c.push_back({"axis 1", OpKind::Concat, {in("a", f32({4, 2})), in("b", f32({4, 3}))}, {}, {}});
  c.back().attrs.set("axis", int64_t(1));
  c.push_back({"[5]->[4,5]", OpKind::BroadcastTo, {x({5})}, {}, {}});
  c.back().attrs.set("shape", std::vector<int64_t>{4, 5});
  // Reductions, constants.
  for (OpKind op : {OpKind::ReduceSum, OpKind::ReduceMean, OpKind::ReduceMax}) {
    c.push_back({"axes [1]", op, {x({4, 6, 5})}, {}, {}});
    c.back().attrs.set("axes", std::vector<int64_t>{1});
    c.push_back({"axes [0,2] keepdims", op, {x({4, 6, 5})}, {}, {}});
    c.back().attrs.set("axes", std::vector<int64_t>{0, 2});
    c.back().attrs.set("keepdims", true);
  }
  c.push_back({"f32[3,3]", OpKind::Full, {}, {}, {}});
  c.back().attrs.set("shape", std::vector<int64_t>{3, 3});
  c.back().attrs.set("value", 1.5);
  // Collectives over an axis of size 1 (the identity).
  Mesh one;
  one.axes.push_back({"tp", 1});
  c.push_back({"tp=1", OpKind::AllReduce, {x({4, 5})}, {}, one});
  c.back().attrs.set("axis", std::string("tp"));
  c.push_back({"tp=1", OpKind::AllGather, {x({4, 5})}, {}, one});
  c.back().attrs.set("axis", std::string("tp"));
  c.back().attrs.set("dim", int64_t(1));
  c.push_back({"tp=1", OpKind::ReduceScatter, {x({4, 5})}, {}, one});
  c.back().attrs.set("axis", std::string("tp"));
  c.back().attrs.set("dim", int64_t(0));
  // Optimizer.
  c.push_back({"2 tensors", OpKind::GlobalNorm, {in("a", f32({10})), in("b", f32({3, 4}))}, {}, {}});
  c.push_back({"2 tensors", OpKind::SumSquares, {in("a", f32({1000})), in("b", f32({3, 4}))}, {}, {}});
  c.push_back({"norm", OpKind::ClipScale, {in("norm", f32({}), 0.5, 3)}, {}, {}});
  c.back().attrs.set("max_norm", 1.0);
  c.push_back({"[37]", OpKind::AdamWUpdate,
               {in("p", f32({37})), in("g", f32({37})), in("m", f32({37})), in("v", f32({37}), 0, 1), in("lr", f32({}), 1e-3, 2e-3),
                in("step", f32({}), 3, 3.5)}, {}, {}});
  c.back().attrs.set("weight_decay", 0.1);
  return c;
}

// The case as a graph: one input per operand, the node, every result an output "out<k>".
inline Result<std::unique_ptr<Graph>> buildOpCase(const OpCase& k) {
  auto g = std::make_unique<Graph>(std::string(opName(k.op)));
  g->setMesh(k.mesh);
  std::vector<Value*> ops;
  for (const InputSpec& s : k.inputs) ops.push_back(g->addInput(s.name + std::to_string(ops.size()), s.type));
  TPC_ASSIGN(Node * n, g->create(k.op, ops, k.attrs));
  for (unsigned r = 0; r < n->numResults(); ++r) g->addOutput(n->result(r), "out" + std::to_string(r));
  return g;
}

inline TensorMap randomInputs(const OpCase& k, const Graph& g, uint32_t seed) {
  std::mt19937 rng(seed);
  TensorMap m;
  for (size_t i = 0; i < k.inputs.size(); ++i) {
    const InputSpec& s = k.inputs[i];
    HostTensor t(s.type);
    for (int64_t e = 0; e < t.numel(); ++e) {
      double u = std::uniform_real_distribution<double>(s.lo, s.hi)(rng);
      t.setFromDouble(e, isFloat(s.type.dtype) ? u : std::floor(u));
    }
    m[g.inputs()[i]->name()] = t;
  }
  return m;
}

}  // namespace tpc::testing
