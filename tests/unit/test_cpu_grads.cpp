// CPU backend: every *_grad op (and dropout's VJP) against central finite differences of its forward
// op, in fp64: for a random weight W, d/dx sum(forward(x) * W) must match grad(W, ...) to 1e-6.
#include "cpu_test_helpers.h"

using namespace tpc;
using namespace tpc::test;

namespace {

// One op compiled once (fp64), run many times.
struct Runner {
  OneOp o;
  std::unique_ptr<CpuExecutor> exec;
  Runner(OpKind op, const std::vector<TensorType>& types, AttrDict attrs = {}) : o(oneOp(op, types, std::move(attrs))) {
    CpuOptions opt;
    opt.fp64 = true;
    opt.threads = 2;
    auto e = CpuExecutor::create(*o.graph, opt);
    REQUIRE(e.ok());
    exec = std::move(e).value();
  }
  std::vector<HostTensor> operator()(const std::vector<HostTensor>& in, int64_t step = 5) {
    std::vector<const HostTensor*> p;
    for (const HostTensor& t : in) p.push_back(&t);
    auto r = exec->run(p, {}, step);
    if (!r.ok()) FAIL(r.error());
    return std::move(r).value();
  }
};

constexpr double kTol = 1e-6;

}  // namespace

TEST_CASE("cpu grad: gelu_grad is the derivative of gelu", "[cpu][grad]") {
  std::mt19937 rng(21);
  TensorType t = f32({3, 17});
  HostTensor x = randomTensor(t, rng, true, -3, 3), w = randomTensor(t, rng, true);
  Runner fwd(OpKind::Gelu, {t}), bwd(OpKind::GeluGrad, {t, t});
  auto num = numericGrad([&](const std::vector<HostTensor>& a) { return dot(fwd({a[0]})[0], w); }, {x}, 0);
  CHECK(normRelErr(values(bwd({w, x})[0]), num) < kTol);
}

TEST_CASE("cpu grad: layer_norm_grad gives dx, dgamma, dbeta", "[cpu][grad]") {
  std::mt19937 rng(22);
  TensorType tx = f32({2, 3, 8}), tg = f32({8});
  HostTensor x = randomTensor(tx, rng, true, -2, 2), g = randomTensor(tg, rng, true, 0.5, 1.5),
             b = randomTensor(tg, rng, true), w = randomTensor(tx, rng, true);
  AttrDict a;
  a.set("eps", 1e-5);
  Runner fwd(OpKind::LayerNorm, {tx, tg, tg}, a), bwd(OpKind::LayerNormGrad, {tx, tx, tg}, a);
  auto f = [&](const std::vector<HostTensor>& in) { return dot(fwd(in)[0], w); };
  auto grads = bwd({w, x, g});
  for (size_t k = 0; k < 3; ++k) {
    INFO("operand " << k);
    CHECK(normRelErr(values(grads[k]), numericGrad(f, {x, g, b}, k)) < kTol);
  }
}

TEST_CASE("cpu grad: softmax_grad along an inner axis", "[cpu][grad]") {
  std::mt19937 rng(23);
  for (int64_t axis : {-1, 1}) {
    TensorType t = f32({2, 5, 3});
    HostTensor x = randomTensor(t, rng, true, -2, 2), w = randomTensor(t, rng, true);
    AttrDict a;
    a.set("axis", axis);
    Runner fwd(OpKind::Softmax, {t}, a), bwd(OpKind::SoftmaxGrad, {t, t}, a);
    auto num = numericGrad([&](const std::vector<HostTensor>& in) { return dot(fwd(in)[0], w); }, {x}, 0);
    HostTensor y = fwd({x})[0];
    INFO("axis " << axis);
    CHECK(normRelErr(values(bwd({w, y})[0]), num) < kTol);
  }
}

TEST_CASE("cpu grad: cross_entropy_grad, with an ignored position", "[cpu][grad]") {
  std::mt19937 rng(24);
  TensorType tl = f32({2, 3, 7}), tt = i32({2, 3}), td = f32({2, 3});
  HostTensor logits = randomTensor(tl, rng, true, -3, 3), w = randomTensor(td, rng, true);
  HostTensor targets = fromValues(tt, {0, 6, 3, -1, 2, 5}, false);
  Runner fwd(OpKind::CrossEntropy, {tl, tt}), bwd(OpKind::CrossEntropyGrad, {td, tl, tt});
  auto num = numericGrad([&](const std::vector<HostTensor>& in) { return dot(fwd(in)[0], w); }, {logits, targets}, 0);
  auto dl = bwd({w, logits, targets})[0];
  CHECK(normRelErr(values(dl), num) < kTol);
  for (int j = 0; j < 7; ++j) CHECK(dl.getAsDouble(3 * 7 + j) == 0.0);  // the ignored row
}

TEST_CASE("cpu grad: attention_grad gives dq, dk, dv (with and without dropout)", "[cpu][grad]") {
  std::mt19937 rng(25);
  for (double p : {0.0, 0.2}) {
    TensorType t = f32({2, 2, 6, 4}), tl = f32({2, 2, 6});
    HostTensor q = randomTensor(t, rng, true), k = randomTensor(t, rng, true), v = randomTensor(t, rng, true),
               w = randomTensor(t, rng, true);
    AttrDict a;
    a.set("dropout", p);
    a.set("key", int64_t(3));
    Runner fwd(OpKind::Attention, {t, t, t}, a), bwd(OpKind::AttentionGrad, {t, t, t, t, t, tl}, a);
    auto f = [&](const std::vector<HostTensor>& in) { return dot(fwd(in)[0], w); };
    auto fo = fwd({q, k, v});
    auto grads = bwd({w, q, k, v, fo[0], fo[1]});
    for (size_t i = 0; i < 3; ++i) {
      INFO("dropout " << p << " operand " << i);
      CHECK(normRelErr(values(grads[i]), numericGrad(f, {q, k, v}, i)) < kTol);
    }
  }
}

TEST_CASE("cpu grad: non-causal attention with more keys than queries", "[cpu][grad]") {
  std::mt19937 rng(28);
  TensorType tq = f32({1, 2, 3, 4}), tk = f32({1, 2, 5, 4}), tl = f32({1, 2, 3});
  HostTensor q = randomTensor(tq, rng, true), k = randomTensor(tk, rng, true), v = randomTensor(tk, rng, true),
             w = randomTensor(tq, rng, true);
  AttrDict a;
  a.set("causal", false);
  a.set("scale", 0.7);
  Runner fwd(OpKind::Attention, {tq, tk, tk}, a), bwd(OpKind::AttentionGrad, {tq, tq, tk, tk, tq, tl}, a);
  auto f = [&](const std::vector<HostTensor>& in) { return dot(fwd(in)[0], w); };
  auto fo = fwd({q, k, v});
  auto grads = bwd({w, q, k, v, fo[0], fo[1]});
  for (size_t i = 0; i < 3; ++i) {
    INFO("operand " << i);
    CHECK(normRelErr(values(grads[i]), numericGrad(f, {q, k, v}, i)) < kTol);
  }
}

TEST_CASE("cpu grad: embedding_grad scatter-adds into its vocab shard", "[cpu][grad]") {
  std::mt19937 rng(26);
  TensorType tt = f32({6, 4}), ti = i32({2, 5}), ty = f32({2, 5, 4});
  HostTensor table = randomTensor(tt, rng, true), w = randomTensor(ty, rng, true);
  HostTensor ids = fromValues(ti, {3, 5, 8, 3, 9, 2, 11, 4, 3, 8}, false);  // shard [3, 9); repeats
  AttrDict fa, ba;
  fa.set("vocab_start", int64_t(3));
  ba.set("vocab_start", int64_t(3));
  ba.set("vocab", int64_t(6));
  Runner fwd(OpKind::Embedding, {tt, ti}, fa), bwd(OpKind::EmbeddingGrad, {ty, ti}, ba);
  auto num = numericGrad([&](const std::vector<HostTensor>& in) { return dot(fwd(in)[0], w); }, {table, ids}, 0);
  CHECK(normRelErr(values(bwd({w, ids})[0]), num) < kTol);
}

TEST_CASE("cpu grad: dropout of dy with the same key is dropout's VJP", "[cpu][grad]") {
  std::mt19937 rng(27);
  TensorType t = f32({5, 40});
  HostTensor x = randomTensor(t, rng, true), w = randomTensor(t, rng, true);
  AttrDict a;
  a.set("p", 0.3);
  a.set("key", int64_t(11));
  Runner drop(OpKind::Dropout, {t}, a);
  auto num = numericGrad([&](const std::vector<HostTensor>& in) { return dot(drop(in)[0], w); }, {x}, 0);
  CHECK(normRelErr(values(drop({w})[0]), num) < kTol);
}
