// CPU backend: every forward op against an independent naive reference written here, in fp32 and fp64.
#include <cmath>
#include <cstring>
#include <limits>

#include "cpu_test_helpers.h"
#include "ir/shape_rules.h"
#include "runtime/philox.h"

using namespace tpc;
using namespace tpc::test;

namespace {

// Index helpers for naive references.
std::vector<int64_t> unravel(int64_t i, const Shape& s) {
  std::vector<int64_t> idx(s.size());
  for (size_t k = s.size(); k-- > 0;) {
    idx[k] = i % s[k];
    i /= s[k];
  }
  return idx;
}
int64_t ravelBroadcast(const std::vector<int64_t>& outIdx, const Shape& s) {
  int64_t off = 0;
  size_t shift = outIdx.size() - s.size();
  for (size_t k = 0; k < s.size(); ++k) off = off * s[k] + (s[k] == 1 ? 0 : outIdx[k + shift]);
  return off;
}

double gelu(double x) { return 0.5 * x * (1 + std::tanh(std::sqrt(2 / M_PI) * (x + 0.044715 * x * x * x))); }

}  // namespace

TEST_CASE("cpu: unary elementwise ops match std:: functions", "[cpu]") {
  std::mt19937 rng(1);
  for (bool fp64 : {false, true}) {
    HostTensor x = randomTensor(f32({3, 70}), rng, fp64, 0.1, 2.0);
    std::vector<double> xv = values(x);
    double tol = fp64 ? 1e-14 : 2e-6;
    auto check = [&](OpKind op, double (*ref)(double), AttrDict attrs = {}) {
      auto out = runOp(op, {x}, attrs, fp64);
      std::vector<double> want;
      for (double v : xv) want.push_back(ref(v));
      INFO(opName(op) << (fp64 ? " fp64" : " fp32"));
      CHECK(maxRelErr(values(out[0]), want) < tol);
    };
    check(OpKind::Neg, [](double v) { return -v; });
    check(OpKind::Exp, [](double v) { return std::exp(v); });
    check(OpKind::Log, [](double v) { return std::log(v); });
    check(OpKind::Sqrt, [](double v) { return std::sqrt(v); });
    check(OpKind::Rsqrt, [](double v) { return 1 / std::sqrt(v); });
    check(OpKind::Tanh, [](double v) { return std::tanh(v); });
    check(OpKind::Gelu, gelu);
    AttrDict s;
    s.set("factor", 2.5);
    check(OpKind::Scale, [](double v) { return 2.5 * v; }, s);
  }
}

TEST_CASE("cpu: cast rounds through bf16/f16 and truncates to integers", "[cpu]") {
  std::mt19937 rng(2);
  HostTensor x = randomTensor(f32({257}), rng, false, -300, 300);
  for (DType to : {DType::bf16, DType::f16, DType::i32}) {
    AttrDict a;
    a.set("to", to);
    auto out = runOp(OpKind::Cast, {x}, a);
    for (int64_t i = 0; i < x.numel(); ++i) {
      float v = x.data<float>()[i];
      double want = to == DType::bf16 ? bf16ToFloat(floatToBf16(v))
                    : to == DType::f16 ? f16ToFloat(floatToF16(v))
                                       : static_cast<double>(static_cast<int32_t>(v));
      REQUIRE(out[0].getAsDouble(i) == want);
    }
  }
  // bf16 values stay rounded through later ops: bf16 + bf16 is rounded again.
  Graph g("bf");
  Value* in = g.addInput("x", f32({4}));
  AttrDict a;
  a.set("to", DType::bf16);
  Value* b = (*g.create(OpKind::Cast, {in}, a))->result();
  Value* s = (*g.create(OpKind::Add, {b, b}, {}))->result();
  Value* e = (*g.create(OpKind::Exp, {s}, {}))->result();
  g.addOutput(e);
  HostTensor xv = fromValues(f32({4}), {0.1, 0.7, 1.3, -0.4}, false);
  auto r = runGraph(g, {xv}, false);
  REQUIRE(r.ok());
  for (int64_t i = 0; i < 4; ++i) {
    float rb = bf16ToFloat(floatToBf16(xv.data<float>()[i]));
    float rs = bf16ToFloat(floatToBf16(rb + rb));
    CHECK(r->at(0).getAsDouble(i) == bf16ToFloat(floatToBf16(std::exp(rs))));
  }
}

TEST_CASE("cpu: binary ops broadcast like numpy", "[cpu]") {
  std::mt19937 rng(3);
  std::vector<std::pair<Shape, Shape>> cases = {
      {{2, 3, 4}, {2, 3, 4}}, {{2, 3, 4}, {4}}, {{2, 1, 4}, {3, 1}}, {{5, 1}, {1, 6}}, {{}, {3, 2}}, {{3, 40, 600}, {600}}};
  for (bool fp64 : {false, true})
    for (auto& [sa, sb] : cases) {
      HostTensor a = randomTensor(f32(sa), rng, fp64, 0.5, 2), b = randomTensor(f32(sb), rng, fp64, 0.5, 2);
      Shape so = *broadcastShapes(sa, sb);
      for (OpKind op : {OpKind::Add, OpKind::Sub, OpKind::Mul, OpKind::Div}) {
        auto out = runOp(op, {a, b}, {}, fp64);
        REQUIRE(out[0].shape() == so);
        std::vector<double> want;
        for (int64_t i = 0; i < out[0].numel(); ++i) {
          auto idx = unravel(i, so);
          double x = a.getAsDouble(ravelBroadcast(idx, sa)), y = b.getAsDouble(ravelBroadcast(idx, sb));
          want.push_back(op == OpKind::Add ? x + y : op == OpKind::Sub ? x - y : op == OpKind::Mul ? x * y : x / y);
        }
        INFO(opName(op) << " " << shapeStr(sa) << " " << shapeStr(sb));
        CHECK(maxRelErr(values(out[0]), want, 1e-3) < (fp64 ? 1e-14 : 1e-6));
      }
    }
  // integer add
  HostTensor ia = fromValues(i32({3}), {1, 2, 3}, false), ib = fromValues(i32({1}), {10}, false);
  auto out = runOp(OpKind::Add, {ia, ib});
  CHECK(values(out[0]) == std::vector<double>{11, 12, 13});
}

TEST_CASE("cpu: matmul with transposes and batch broadcasting matches triple loops", "[cpu]") {
  std::mt19937 rng(4);
  struct Case {
    Shape a, b;
    bool ta, tb;
  };
  std::vector<Case> cases = {{{5, 7}, {7, 3}, false, false},       {{7, 5}, {7, 3}, true, false},
                             {{5, 7}, {3, 7}, false, true},        {{7, 5}, {3, 7}, true, true},
                             {{2, 9, 17}, {17, 13}, false, false}, {{2, 1, 6, 5}, {4, 7, 5}, false, true},
                             {{3, 5, 6}, {3, 5, 7}, true, false},  {{67, 300}, {300, 45}, false, false},
                             {{2, 33, 20}, {2, 20, 70}, false, false}};
  for (bool fp64 : {false, true})
    for (const Case& c : cases) {
      HostTensor A = randomTensor(f32(c.a), rng, fp64), B = randomTensor(f32(c.b), rng, fp64);
      AttrDict at;
      at.set("transpose_a", c.ta);
      at.set("transpose_b", c.tb);
      auto out = runOp(OpKind::Matmul, {A, B}, at, fp64);
      const Shape& so = out[0].shape();
      int64_t r = so.size(), M = so[r - 2], N = so[r - 1];
      int64_t K = c.ta ? c.a[c.a.size() - 2] : c.a.back();
      Shape ab(c.a.begin(), c.a.end() - 2), bb(c.b.begin(), c.b.end() - 2), ob(so.begin(), so.end() - 2);
      std::vector<double> want;
      for (int64_t i = 0; i < out[0].numel(); ++i) {
        auto idx = unravel(i, so);
        std::vector<int64_t> bidx(idx.begin(), idx.end() - 2);
        int64_t oa = ab.empty() ? 0 : ravelBroadcast(bidx, ab), obb = bb.empty() ? 0 : ravelBroadcast(bidx, bb);
        int64_t m = idx[r - 2], n = idx[r - 1];
        double s = 0;
        for (int64_t k = 0; k < K; ++k) {
          double x = A.getAsDouble(oa * M * K + (c.ta ? k * M + m : m * K + k));
          double y = B.getAsDouble(obb * K * N + (c.tb ? n * K + k : k * N + n));
          s += x * y;
        }
        want.push_back(s);
      }
      INFO(shapeStr(c.a) << (c.ta ? "^T" : "") << " x " << shapeStr(c.b) << (c.tb ? "^T" : ""));
      CHECK(maxRelErr(values(out[0]), want, 1e-1) < (fp64 ? 1e-12 : 1e-4));
    }
}

namespace {
// Materialized causal attention in double: softmax(scale Q K^T + mask) (with dropout) V, and lse.
void naiveAttention(const HostTensor& q, const HostTensor& k, const HostTensor& v, double scale, double p, int key,
                    int64_t step, std::vector<double>* out, std::vector<double>* lse) {
  int64_t B = q.shape()[0], H = q.shape()[1], T = q.shape()[2], D = q.shape()[3];
  out->assign(q.numel(), 0);
  lse->assign(B * H * T, 0);
  for (int64_t bh = 0; bh < B * H; ++bh)
    for (int64_t i = 0; i < T; ++i) {
      std::vector<double> s(T, -std::numeric_limits<double>::infinity());
      double m = -1e300;
      for (int64_t j = 0; j <= i; ++j) {
        double acc = 0;
        for (int64_t c = 0; c < D; ++c) acc += q.getAsDouble((bh * T + i) * D + c) * k.getAsDouble((bh * T + j) * D + c);
        s[j] = acc * scale;
        m = std::max(m, s[j]);
      }
      double z = 0;
      for (int64_t j = 0; j < T; ++j) z += std::exp(s[j] - m);
      (*lse)[bh * T + i] = m + std::log(z);
      for (int64_t j = 0; j < T; ++j) {
        double pr = std::exp(s[j] - m) / z;
        if (p > 0) {
          bool keep = philox::dropoutKeep(1234, step, key, (bh * T + i) * T + j, static_cast<float>(p));
          pr = keep ? pr / (1 - p) : 0;
        }
        for (int64_t c = 0; c < D; ++c) (*out)[(bh * T + i) * D + c] += pr * v.getAsDouble((bh * T + j) * D + c);
      }
    }
}
}  // namespace

TEST_CASE("cpu: attention matches a materialized softmax(QK^T)V", "[cpu]") {
  std::mt19937 rng(5);
  for (bool fp64 : {false, true})
    for (double p : {0.0, 0.25}) {
      TensorType t = f32({2, 3, 9, 8});
      HostTensor q = randomTensor(t, rng, fp64), k = randomTensor(t, rng, fp64), v = randomTensor(t, rng, fp64);
      AttrDict a;
      a.set("dropout", p);
      a.set("key", int64_t(7));
      auto out = runOp(OpKind::Attention, {q, k, v}, a, fp64, 3);
      std::vector<double> wo, wl;
      naiveAttention(q, k, v, 1 / std::sqrt(8.0), p, 7, 3, &wo, &wl);
      CHECK(maxRelErr(values(out[0]), wo, 1e-2) < (fp64 ? 1e-12 : 1e-4));
      CHECK(maxRelErr(values(out[1]), wl, 1e-2) < (fp64 ? 1e-12 : 1e-5));
    }
  // explicit scale
  HostTensor q = randomTensor(f32({1, 1, 5, 4}), rng, true), k = randomTensor(f32({1, 1, 5, 4}), rng, true),
             v = randomTensor(f32({1, 1, 5, 4}), rng, true);
  AttrDict a;
  a.set("scale", 0.3);
  auto out = runOp(OpKind::Attention, {q, k, v}, a, true);
  std::vector<double> wo, wl;
  naiveAttention(q, k, v, 0.3, 0, 0, 0, &wo, &wl);
  CHECK(maxRelErr(values(out[0]), wo) < 1e-12);
}

// layer_norm with a residual operand (fold-layer-norm-residual): s has the bits of add(x, residual) and y those of
// layer_norm(s), in bf16 and f32.
TEST_CASE("cpu: layer_norm with a residual gives the add's bits and the layer_norm of them", "[cpu]") {
  std::mt19937 rng(16);
  for (DType dt : {DType::bf16, DType::f32}) {
    INFO(dtypeName(dt));
    auto draw = [&](Shape shape, double lo, double hi) {
      HostTensor t = randomTensor(f32(std::move(shape)), rng, false, lo, hi);
      return dt == DType::f32 ? t : t.convertTo(dt);
    };
    HostTensor x = draw({3, 5, 24}, -2, 3), r = draw({3, 5, 24}, -1, 1);
    HostTensor g = randomTensor(f32({24}), rng, false, 0.5, 1.5), b = randomTensor(f32({24}), rng, false);
    AttrDict ae;
    ae.set("eps", 1e-5);
    auto fused = runOp(OpKind::LayerNorm, {x, g, b, r}, ae, false);
    REQUIRE(fused.size() == 2);
    auto sum = runOp(OpKind::Add, {x, r}, {}, false);
    // (The executor hands results back in f32: the sum goes on as x's dtype, as in a graph.)
    auto ln = runOp(OpKind::LayerNorm, {sum[0].dtype() == dt ? sum[0] : sum[0].convertTo(dt), g, b}, ae, false);
    auto same = [](const HostTensor& p, const HostTensor& q) {
      if (p.numel() != q.numel()) return false;
      for (int64_t i = 0; i < p.numel(); ++i)
        if (p.getAsDouble(i) != q.getAsDouble(i)) return false;
      return true;
    };
    CHECK(same(fused[1], sum[0]));
    CHECK(same(fused[0], ln[0]));
  }
}

TEST_CASE("cpu: layer_norm, softmax and cross_entropy match direct formulas", "[cpu]") {
  std::mt19937 rng(6);
  for (bool fp64 : {false, true}) {
    double tol = fp64 ? 1e-12 : 2e-5;
    // layer_norm
    HostTensor x = randomTensor(f32({3, 4, 10}), rng, fp64, -2, 3), g = randomTensor(f32({10}), rng, fp64),
               b = randomTensor(f32({10}), rng, fp64);
    AttrDict ae;
    ae.set("eps", 1e-3);
    auto ln = runOp(OpKind::LayerNorm, {x, g, b}, ae, fp64);
    std::vector<double> want;
    for (int64_t r = 0; r < 12; ++r) {
      double m = 0, v = 0;
      for (int j = 0; j < 10; ++j) m += x.getAsDouble(r * 10 + j) / 10;
      for (int j = 0; j < 10; ++j) v += std::pow(x.getAsDouble(r * 10 + j) - m, 2) / 10;
      for (int j = 0; j < 10; ++j)
        want.push_back((x.getAsDouble(r * 10 + j) - m) / std::sqrt(v + 1e-3) * g.getAsDouble(j) + b.getAsDouble(j));
    }
    CHECK(maxRelErr(values(ln[0]), want, 1e-2) < tol);

    // softmax along axis 1 of [3, 5, 4]
    HostTensor s = randomTensor(f32({3, 5, 4}), rng, fp64, -3, 3);
    AttrDict ax;
    ax.set("axis", int64_t(1));
    auto sm = runOp(OpKind::Softmax, {s}, ax, fp64);
    want.assign(60, 0);
    for (int o = 0; o < 3; ++o)
      for (int in = 0; in < 4; ++in) {
        double z = 0;
        for (int j = 0; j < 5; ++j) z += std::exp(s.getAsDouble((o * 5 + j) * 4 + in));
        for (int j = 0; j < 5; ++j) want[(o * 5 + j) * 4 + in] = std::exp(s.getAsDouble((o * 5 + j) * 4 + in)) / z;
      }
    CHECK(maxRelErr(values(sm[0]), want, 1e-3) < tol);

    // cross_entropy with an ignored position
    HostTensor logits = randomTensor(f32({2, 3, 11}), rng, fp64, -4, 4);
    HostTensor tg = fromValues(i32({2, 3}), {0, 10, -1, 5, 3, 7}, false);
    auto ce = runOp(OpKind::CrossEntropy, {logits, tg}, {}, fp64);
    want.clear();
    for (int r = 0; r < 6; ++r) {
      int64_t t = static_cast<int64_t>(tg.getAsDouble(r));
      if (t < 0) {
        want.push_back(0);
        continue;
      }
      double z = 0;
      for (int j = 0; j < 11; ++j) z += std::exp(logits.getAsDouble(r * 11 + j));
      want.push_back(std::log(z) - logits.getAsDouble(r * 11 + t));
    }
    CHECK(maxRelErr(values(ce[0]), want, 1e-3) < tol);
  }
  // a target out of range is a clear error
  OneOp o = oneOp(OpKind::CrossEntropy, {f32({2, 4}), i32({2})});
  HostTensor l(f32({2, 4}));
  HostTensor t = fromValues(i32({2}), {1, 9}, false);
  auto r = runGraph(*o.graph, {l, t}, false);
  REQUIRE(!r.ok());
  CHECK(r.error().find("target 9") != std::string::npos);
}

TEST_CASE("cpu: embedding gathers rows of its vocab shard", "[cpu]") {
  std::mt19937 rng(7);
  HostTensor table = randomTensor(f32({5, 3}), rng, false);
  HostTensor ids = fromValues(i32({2, 3}), {10, 14, 9, 15, 12, 11}, false);
  AttrDict a;
  a.set("vocab_start", int64_t(10));
  auto out = runOp(OpKind::Embedding, {table, ids}, a);
  REQUIRE(out[0].shape() == Shape{2, 3, 3});
  for (int r = 0; r < 6; ++r) {
    int64_t row = static_cast<int64_t>(ids.getAsDouble(r)) - 10;
    for (int j = 0; j < 3; ++j) CHECK(out[0].getAsDouble(r * 3 + j) == (row >= 0 && row < 5 ? table.getAsDouble(row * 3 + j) : 0.0));
  }
}

TEST_CASE("cpu: movement ops match index arithmetic", "[cpu]") {
  std::mt19937 rng(8);
  HostTensor x = randomTensor(f32({2, 3, 4}), rng, false);
  auto xv = values(x);
  {  // reshape keeps the data
    AttrDict a;
    a.set("shape", std::vector<int64_t>{4, -1});
    auto out = runOp(OpKind::Reshape, {x}, a);
    CHECK(out[0].shape() == Shape{4, 6});
    CHECK(values(out[0]) == xv);
  }
  {  // transpose perm [2, 0, 1]
    AttrDict a;
    a.set("perm", std::vector<int64_t>{2, 0, 1});
    auto out = runOp(OpKind::Transpose, {x}, a);
    REQUIRE(out[0].shape() == Shape{4, 2, 3});
    for (int i = 0; i < 4; ++i)
      for (int j = 0; j < 2; ++j)
        for (int k = 0; k < 3; ++k) CHECK(out[0].getAsDouble((i * 2 + j) * 3 + k) == xv[(j * 3 + k) * 4 + i]);
  }
  {  // slice axis 1 [1, 3)
    AttrDict a;
    a.set("axis", int64_t(1));
    a.set("start", int64_t(1));
    a.set("end", int64_t(3));
    auto out = runOp(OpKind::Slice, {x}, a);
    REQUIRE(out[0].shape() == Shape{2, 2, 4});
    for (int i = 0; i < 2; ++i)
      for (int j = 0; j < 2; ++j)
        for (int k = 0; k < 4; ++k) CHECK(out[0].getAsDouble((i * 2 + j) * 4 + k) == xv[(i * 3 + j + 1) * 4 + k]);
  }
  {  // concat on axis -1 of [2,3,4] and [2,3,1]
    HostTensor y = randomTensor(f32({2, 3, 1}), rng, false);
    AttrDict a;
    a.set("axis", int64_t(-1));
    auto out = runOp(OpKind::Concat, {x, y}, a);
    REQUIRE(out[0].shape() == Shape{2, 3, 5});
    for (int r = 0; r < 6; ++r) {
      for (int k = 0; k < 4; ++k) CHECK(out[0].getAsDouble(r * 5 + k) == xv[r * 4 + k]);
      CHECK(out[0].getAsDouble(r * 5 + 4) == y.getAsDouble(r));
    }
  }
  {  // broadcast_to [3, 1] -> [2, 3, 4]
    HostTensor y = randomTensor(f32({3, 1}), rng, false);
    AttrDict a;
    a.set("shape", std::vector<int64_t>{2, 3, 4});
    auto out = runOp(OpKind::BroadcastTo, {y}, a);
    for (int64_t i = 0; i < 24; ++i) CHECK(out[0].getAsDouble(i) == y.getAsDouble((i / 4) % 3));
  }
  {  // integer tensors move too
    HostTensor ids = fromValues(i32({2, 2}), {1, 2, 3, 4}, false);
    AttrDict a;
    a.set("perm", std::vector<int64_t>{1, 0});
    auto out = runOp(OpKind::Transpose, {ids}, a);
    CHECK(out[0].dtype() == DType::i32);
    CHECK(values(out[0]) == std::vector<double>{1, 3, 2, 4});
  }
}

TEST_CASE("cpu: reductions over axes with keepdims, and full", "[cpu]") {
  std::mt19937 rng(9);
  for (Shape s : {Shape{3, 4, 5}, Shape{64, 33, 40}}) {
    HostTensor x = randomTensor(f32(s), rng, true);
    for (std::vector<int64_t> axes : {std::vector<int64_t>{1}, std::vector<int64_t>{0, 2}, std::vector<int64_t>{-1},
                                      std::vector<int64_t>{0, 1, 2}})
      for (bool keep : {false, true})
        for (OpKind op : {OpKind::ReduceSum, OpKind::ReduceMean, OpKind::ReduceMax}) {
          AttrDict a;
          a.set("axes", axes);
          a.set("keepdims", keep);
          auto out = runOp(op, {x}, a, true);
          std::vector<bool> red(3, false);
          for (int64_t ax : axes) red[(ax + 3) % 3] = true;
          Shape os;
          for (int k = 0; k < 3; ++k)
            if (!red[k]) os.push_back(s[k]);
            else if (keep) os.push_back(1);
          REQUIRE(out[0].shape() == os);
          std::vector<double> want(out[0].numel(), op == OpKind::ReduceMax ? -1e300 : 0.0);
          double count = static_cast<double>(x.numel()) / out[0].numel();
          for (int64_t i = 0; i < x.numel(); ++i) {
            auto idx = unravel(i, s);
            int64_t o = 0;
            for (int k = 0; k < 3; ++k)
              if (!red[k]) o = o * s[k] + idx[k];
            double v = x.getAsDouble(i);
            want[o] = op == OpKind::ReduceMax ? std::max(want[o], v) : want[o] + (op == OpKind::ReduceMean ? v / count : v);
          }
          INFO(opName(op) << " " << shapeStr(s) << " axes " << shapeStr(axes));
          CHECK(maxRelErr(values(out[0]), want, 1e-6) < 1e-10);
        }
  }
  AttrDict a;
  a.set("shape", std::vector<int64_t>{2, 3});
  a.set("value", 1.5);
  auto out = runOp(OpKind::Full, {}, a);
  CHECK(values(out[0]) == std::vector<double>(6, 1.5));
}

TEST_CASE("cpu: collectives are the identity over an axis of size 1, a single-rank executor refuses larger ones", "[cpu]") {
  std::mt19937 rng(10);
  HostTensor x = randomTensor(f32({4, 6}), rng, false);
  for (OpKind op : {OpKind::AllReduce, OpKind::AllGather, OpKind::ReduceScatter}) {
    AttrDict a;
    a.set("axis", "tp");
    if (op != OpKind::AllReduce) a.set("dim", int64_t(1));
    OneOp o = oneOp(op, {f32({4, 6})}, a, Mesh{{{"tp", 1}}});
    auto r = runGraph(*o.graph, {x}, false);
    REQUIRE(r.ok());
    CHECK(values(r->at(0)) == values(x));
    OneOp o2 = oneOp(op, {f32({4, 6})}, a, Mesh{{{"tp", 2}}});
    auto r2 = CpuExecutor::create(*o2.graph, CpuOptions{});
    REQUIRE(!r2.ok());
    CHECK(r2.error().find("run per-rank graphs with the CPU mesh backend") != std::string::npos);
  }
}

TEST_CASE("cpu: global_norm, clip_scale and adamw_update follow their formulas", "[cpu]") {
  std::mt19937 rng(11);
  HostTensor a = randomTensor(f32({7, 3}), rng, false), b = randomTensor(f32({50}), rng, false);
  auto n = runOp(OpKind::GlobalNorm, {a, b});
  double ss = 0;
  for (double v : values(a)) ss += v * v;
  for (double v : values(b)) ss += v * v;
  CHECK(n[0].getAsDouble(0) == Approx(std::sqrt(ss)).epsilon(1e-6));

  for (double norm : {0.5, 3.0}) {
    AttrDict c;
    c.set("max_norm", 1.0);
    auto s = runOp(OpKind::ClipScale, {HostTensor::scalarF32(static_cast<float>(norm))}, c);
    CHECK(s[0].getAsDouble(0) == Approx(std::min(1.0, 1.0 / (norm + 1e-6))).epsilon(1e-6));
  }

  for (bool fp64 : {false, true}) {
    TensorType t = f32({4, 5});
    HostTensor p = randomTensor(t, rng, fp64), g = randomTensor(t, rng, fp64), m = randomTensor(t, rng, fp64),
               v = randomTensor(t, rng, fp64, 0.0, 0.1);
    HostTensor lr = fromValues(f32({}), {3e-3}, fp64), step = fromValues(f32({}), {4}, fp64);
    AttrDict at;
    at.set("beta1", 0.9);
    at.set("beta2", 0.95);
    at.set("eps", 1e-8);
    at.set("weight_decay", 0.1);
    auto out = runOp(OpKind::AdamWUpdate, {p, g, m, v, lr, step}, at, fp64);
    std::vector<double> wp, wm, wv;
    for (int64_t i = 0; i < 20; ++i) {
      double gi = g.getAsDouble(i), pi = p.getAsDouble(i);
      double mi = 0.9 * m.getAsDouble(i) + 0.1 * gi, vi = 0.95 * v.getAsDouble(i) + 0.05 * gi * gi;
      double mh = mi / (1 - std::pow(0.9, 4)), vh = vi / (1 - std::pow(0.95, 4));
      wp.push_back(pi - 3e-3 * (mh / (std::sqrt(vh) + 1e-8) + 0.1 * pi));
      wm.push_back(mi);
      wv.push_back(vi);
    }
    double tol = fp64 ? 1e-12 : 1e-5;
    CHECK(maxRelErr(values(out[0]), wp, 1e-3) < tol);
    CHECK(maxRelErr(values(out[1]), wm, 1e-3) < tol);
    CHECK(maxRelErr(values(out[2]), wv, 1e-3) < tol);
  }
}
