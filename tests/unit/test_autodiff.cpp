// Autodiff: every differentiable op's VJP checked against central finite differences in fp64, and the
// structure of the training step (names, micro-batch slicing, clipping, weight decay). The gradient checks
// run on a tiny fp64 evaluator kept in this file (RefEval), so they do not wait for the CPU executor.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <random>

#include "ir/parser.h"
#include "ir/printer.h"
#include "passes/autodiff.h"
#include "passes/builtin_passes.h"
#include "gradcheck.h"
#include "test_support.h"
#include "worst_error.h"

#include "runtime/cpu/cpu_executor.h"

namespace tpc {
namespace {

// ---- RefEval: a plain fp64 evaluator for the ops the gradient checks use -----------------------------

struct Tensor {
  Shape shape;
  std::vector<double> d;
  Tensor() = default;
  explicit Tensor(Shape s) : shape(std::move(s)), d(static_cast<size_t>(numel(shape)), 0.0) {}
  static int64_t numel(llvm::ArrayRef<int64_t> s) {
    int64_t n = 1;
    for (int64_t x : s) n *= x;
    return n;
  }
  int64_t size() const { return static_cast<int64_t>(d.size()); }
};

std::vector<int64_t> unravel(int64_t flat, llvm::ArrayRef<int64_t> shape) {
  std::vector<int64_t> idx(shape.size());
  for (int64_t k = static_cast<int64_t>(shape.size()) - 1; k >= 0; --k) {
    idx[k] = shape[k] ? flat % shape[k] : 0;
    flat = shape[k] ? flat / shape[k] : 0;
  }
  return idx;
}
int64_t ravel(llvm::ArrayRef<int64_t> idx, llvm::ArrayRef<int64_t> shape) {
  int64_t f = 0;
  for (size_t k = 0; k < shape.size(); ++k) f = f * shape[k] + idx[k];
  return f;
}
// The flat index into `in` (numpy-broadcast to `out`) of output multi-index `idx`.
int64_t bcastIndex(llvm::ArrayRef<int64_t> idx, llvm::ArrayRef<int64_t> out, llvm::ArrayRef<int64_t> in) {
  size_t lead = out.size() - in.size();
  int64_t f = 0;
  for (size_t k = 0; k < in.size(); ++k) f = f * in[k] + (in[k] == 1 ? 0 : idx[k + lead]);
  return f;
}
int64_t normAxis(int64_t a, size_t rank) { return a < 0 ? a + static_cast<int64_t>(rank) : a; }

double geluRef(double x) {
  const double c = std::sqrt(2.0 / M_PI);
  return 0.5 * x * (1.0 + std::tanh(c * (x + 0.044715 * x * x * x)));
}
double geluDerivRef(double x) {
  const double c = std::sqrt(2.0 / M_PI);
  double u = c * (x + 0.044715 * x * x * x), t = std::tanh(u);
  return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * c * (1.0 + 3.0 * 0.044715 * x * x);
}
// A stand-in for Philox: any deterministic function of (key, element index) exercises dropout's VJP.
bool keepRef(int64_t key, int64_t i, double p) {
  uint64_t h = static_cast<uint64_t>(key) * 0x9E3779B97F4A7C15ull ^ static_cast<uint64_t>(i) * 0xC2B2AE3D27D4EB4Full;
  h ^= h >> 29;
  h *= 0xBF58476D1CE4E5B9ull;
  h ^= h >> 32;
  return static_cast<double>(h % 1000003) / 1000003.0 >= p;
}

class RefEval {
 public:
  // Values of the graph's inputs and params (by Value), then every node in program order.
  Result<std::vector<Tensor>> run(const Graph& g, const std::map<const Value*, Tensor>& args) {
    env_.clear();
    for (auto& [v, t] : args) env_[v] = t;
    for (const Node* n : g.nodes()) {
      std::vector<const Tensor*> in;
      for (Value* v : n->operands()) {
        auto it = env_.find(v);
        if (it == env_.end()) return makeError("RefEval: operand of ", n->opName(), " has no value");
        in.push_back(&it->second);
      }
      TPC_ASSIGN(std::vector<Tensor> out, eval(*n, in));
      for (unsigned i = 0; i < n->numResults(); ++i) {
        out[i].shape = n->result(i)->shape();
        env_[n->result(i)] = std::move(out[i]);
      }
    }
    std::vector<Tensor> outs;
    for (const GraphOutput& o : g.outputs()) outs.push_back(env_.at(o.value));
    return outs;
  }

 private:
  using Ts = std::vector<Tensor>;
  static Ts one(Tensor t) { return Ts{std::move(t)}; }

  static Tensor unary(const Tensor& x, const std::function<double(double)>& f) {
    Tensor y(x.shape);
    for (int64_t i = 0; i < x.size(); ++i) y.d[i] = f(x.d[i]);
    return y;
  }
  static Tensor binary(const Node& n, const Tensor& a, const Tensor& b, const std::function<double(double, double)>& f) {
    Shape out = n.result()->shape();
    Tensor y(out);
    for (int64_t i = 0; i < y.size(); ++i) {
      auto idx = unravel(i, out);
      y.d[i] = f(a.d[bcastIndex(idx, out, a.shape)], b.d[bcastIndex(idx, out, b.shape)]);
    }
    return y;
  }
  // Calls f(base, stride, len) for every 1-D lane along `axis`.
  static void lanes(llvm::ArrayRef<int64_t> shape, int64_t axis, const std::function<void(int64_t, int64_t, int64_t)>& f) {
    int64_t len = shape[axis], inner = 1, outer = 1;
    for (size_t k = axis + 1; k < shape.size(); ++k) inner *= shape[k];
    for (int64_t k = 0; k < axis; ++k) outer *= shape[k];
    for (int64_t o = 0; o < outer; ++o)
      for (int64_t i = 0; i < inner; ++i) f(o * len * inner + i, inner, len);
  }

  Result<Ts> eval(const Node& n, const std::vector<const Tensor*>& in) {
    const Shape& outShape = n.result()->shape();
    switch (n.op()) {
      case OpKind::Neg: return one(unary(*in[0], [](double x) { return -x; }));
      case OpKind::Exp: return one(unary(*in[0], [](double x) { return std::exp(x); }));
      case OpKind::Log: return one(unary(*in[0], [](double x) { return std::log(x); }));
      case OpKind::Sqrt: return one(unary(*in[0], [](double x) { return std::sqrt(x); }));
      case OpKind::Rsqrt: return one(unary(*in[0], [](double x) { return 1.0 / std::sqrt(x); }));
      case OpKind::Tanh: return one(unary(*in[0], [](double x) { return std::tanh(x); }));
      case OpKind::Gelu: return one(unary(*in[0], geluRef));
      case OpKind::Cast: return one(*in[0]);
      case OpKind::Scale: {
        double f = n.getFloat("factor");
        return one(unary(*in[0], [f](double x) { return x * f; }));
      }
      case OpKind::Dropout: {
        double p = n.getFloat("p");
        int64_t key = n.getInt("key");
        Tensor y(in[0]->shape);
        for (int64_t i = 0; i < y.size(); ++i) y.d[i] = keepRef(key, i, p) ? in[0]->d[i] / (1.0 - p) : 0.0;
        return one(y);
      }
      case OpKind::Add: return one(binary(n, *in[0], *in[1], [](double a, double b) { return a + b; }));
      case OpKind::Sub: return one(binary(n, *in[0], *in[1], [](double a, double b) { return a - b; }));
      case OpKind::Mul: return one(binary(n, *in[0], *in[1], [](double a, double b) { return a * b; }));
      case OpKind::Div: return one(binary(n, *in[0], *in[1], [](double a, double b) { return a / b; }));
      case OpKind::GeluGrad: return one(binary(n, *in[0], *in[1], [](double dy, double x) { return dy * geluDerivRef(x); }));
      case OpKind::LayerNorm:
      case OpKind::LayerNormGrad: return layerNorm(n, in);
      case OpKind::Softmax: {
        Tensor y(in[0]->shape);
        lanes(y.shape, normAxis(n.getInt("axis"), y.shape.size()), [&](int64_t b, int64_t s, int64_t len) {
          double m = -INFINITY, z = 0;
          for (int64_t j = 0; j < len; ++j) m = std::max(m, in[0]->d[b + j * s]);
          for (int64_t j = 0; j < len; ++j) z += std::exp(in[0]->d[b + j * s] - m);
          for (int64_t j = 0; j < len; ++j) y.d[b + j * s] = std::exp(in[0]->d[b + j * s] - m) / z;
        });
        return one(y);
      }
      case OpKind::SoftmaxGrad: {  // (dy, y) -> y * (dy - sum(dy * y))
        Tensor dx(in[0]->shape);
        const Tensor &dy = *in[0], &y = *in[1];
        lanes(dx.shape, normAxis(n.getInt("axis"), dx.shape.size()), [&](int64_t b, int64_t s, int64_t len) {
          double dot = 0;
          for (int64_t j = 0; j < len; ++j) dot += dy.d[b + j * s] * y.d[b + j * s];
          for (int64_t j = 0; j < len; ++j) dx.d[b + j * s] = y.d[b + j * s] * (dy.d[b + j * s] - dot);
        });
        return one(dx);
      }
      case OpKind::CrossEntropy:
      case OpKind::CrossEntropyGrad: return crossEntropy(n, in);
      case OpKind::Matmul: return matmul(n, *in[0], *in[1]);
      case OpKind::Attention:
      case OpKind::AttentionGrad: return attention(n, in);
      case OpKind::Embedding: {
        const Tensor &table = *in[0], &ids = *in[1];
        int64_t V = table.shape[0], D = table.shape[1], vs = n.getInt("vocab_start");
        Tensor y(outShape);
        for (int64_t i = 0; i < ids.size(); ++i) {
          int64_t r = static_cast<int64_t>(ids.d[i]) - vs;
          if (r < 0 || r >= V) continue;
          for (int64_t j = 0; j < D; ++j) y.d[i * D + j] = table.d[r * D + j];
        }
        return one(y);
      }
      case OpKind::EmbeddingGrad: {
        const Tensor &dy = *in[0], &ids = *in[1];
        int64_t V = n.getInt("vocab"), D = dy.shape.back(), vs = n.getInt("vocab_start");
        Tensor dt(outShape);
        for (int64_t i = 0; i < ids.size(); ++i) {
          int64_t r = static_cast<int64_t>(ids.d[i]) - vs;
          if (r < 0 || r >= V) continue;
          for (int64_t j = 0; j < D; ++j) dt.d[r * D + j] += dy.d[i * D + j];
        }
        return one(dt);
      }
      case OpKind::Reshape: {
        Tensor y = *in[0];
        y.shape = outShape;
        return one(y);
      }
      case OpKind::Transpose: {
        const auto& perm = n.getInts("perm");
        Tensor y(outShape);
        for (int64_t i = 0; i < y.size(); ++i) {
          auto idx = unravel(i, outShape);
          std::vector<int64_t> src(idx.size());
          for (size_t k = 0; k < perm.size(); ++k) src[perm[k]] = idx[k];
          y.d[i] = in[0]->d[ravel(src, in[0]->shape)];
        }
        return one(y);
      }
      case OpKind::Slice: {
        int64_t ax = normAxis(n.getInt("axis"), outShape.size()), s = n.getInt("start");
        Tensor y(outShape);
        for (int64_t i = 0; i < y.size(); ++i) {
          auto idx = unravel(i, outShape);
          idx[ax] += s;
          y.d[i] = in[0]->d[ravel(idx, in[0]->shape)];
        }
        return one(y);
      }
      case OpKind::Concat: {
        int64_t ax = normAxis(n.getInt("axis"), outShape.size());
        Tensor y(outShape);
        for (int64_t i = 0; i < y.size(); ++i) {
          auto idx = unravel(i, outShape);
          size_t k = 0;
          while (idx[ax] >= in[k]->shape[ax]) idx[ax] -= in[k++]->shape[ax];
          y.d[i] = in[k]->d[ravel(idx, in[k]->shape)];
        }
        return one(y);
      }
      case OpKind::BroadcastTo: {
        Tensor y(outShape);
        for (int64_t i = 0; i < y.size(); ++i) y.d[i] = in[0]->d[bcastIndex(unravel(i, outShape), outShape, in[0]->shape)];
        return one(y);
      }
      case OpKind::ReduceSum:
      case OpKind::ReduceMean: {
        const Shape& xs = in[0]->shape;
        std::vector<bool> red(xs.size(), false);
        for (int64_t a : n.getInts("axes")) red[normAxis(a, xs.size())] = true;
        Tensor y(outShape);
        for (int64_t i = 0; i < in[0]->size(); ++i) {
          auto idx = unravel(i, xs);
          std::vector<int64_t> o;
          for (size_t k = 0; k < xs.size(); ++k)
            if (!red[k]) o.push_back(idx[k]);
            else if (n.getBool("keepdims")) o.push_back(0);
          y.d[ravel(o, outShape)] += in[0]->d[i];
        }
        if (n.op() == OpKind::ReduceMean) {
          double c = static_cast<double>(in[0]->size()) / static_cast<double>(std::max<int64_t>(y.size(), 1));
          for (double& v : y.d) v /= c;
        }
        return one(y);
      }
      case OpKind::Full: {
        Tensor y(outShape);
        std::fill(y.d.begin(), y.d.end(), n.getFloat("value"));
        return one(y);
      }
      case OpKind::GlobalNorm: {
        double s = 0;
        for (const Tensor* t : in)
          for (double v : t->d) s += v * v;
        Tensor y(outShape);
        y.d[0] = std::sqrt(s);
        return one(y);
      }
      case OpKind::ClipScale: {
        Tensor y(outShape);
        y.d[0] = std::min(1.0, n.getFloat("max_norm") / (in[0]->d[0] + 1e-6));
        return one(y);
      }
      case OpKind::AdamWUpdate: {
        const Tensor &p = *in[0], &gr = *in[1], &m = *in[2], &v = *in[3];
        double lr = in[4]->d[0], step = in[5]->d[0], b1 = n.getFloat("beta1"), b2 = n.getFloat("beta2"),
               eps = n.getFloat("eps"), wd = n.getFloat("weight_decay");
        Tensor np(p.shape), nm(p.shape), nv(p.shape);
        for (int64_t i = 0; i < p.size(); ++i) {
          nm.d[i] = b1 * m.d[i] + (1 - b1) * gr.d[i];
          nv.d[i] = b2 * v.d[i] + (1 - b2) * gr.d[i] * gr.d[i];
          double mh = nm.d[i] / (1 - std::pow(b1, step)), vh = nv.d[i] / (1 - std::pow(b2, step));
          np.d[i] = p.d[i] - lr * (mh / (std::sqrt(vh) + eps) + wd * p.d[i]);
        }
        return Ts{np, nm, nv};
      }
      default: return makeError("RefEval: no kernel for ", n.opName());
    }
  }

  static Result<Ts> layerNorm(const Node& n, const std::vector<const Tensor*>& in) {
    bool grad = n.op() == OpKind::LayerNormGrad;
    const Tensor& x = grad ? *in[1] : *in[0];
    const Tensor& gamma = grad ? *in[2] : *in[1];
    int64_t D = x.shape.back(), rows = x.size() / D;
    double eps = n.getFloat("eps");
    Tensor y(x.shape), dx(x.shape), dg(gamma.shape), db(gamma.shape);
    for (int64_t r = 0; r < rows; ++r) {
      const double* xr = &x.d[r * D];
      double mean = 0, var = 0;
      for (int64_t j = 0; j < D; ++j) mean += xr[j];
      mean /= D;
      for (int64_t j = 0; j < D; ++j) var += (xr[j] - mean) * (xr[j] - mean);
      var /= D;
      double rstd = 1.0 / std::sqrt(var + eps);
      if (!grad) {
        for (int64_t j = 0; j < D; ++j) y.d[r * D + j] = (xr[j] - mean) * rstd * gamma.d[j] + in[2]->d[j];
        continue;
      }
      const double* dyr = &in[0]->d[r * D];
      double s1 = 0, s2 = 0;  // mean(dxhat), mean(dxhat * xhat)
      for (int64_t j = 0; j < D; ++j) {
        double xh = (xr[j] - mean) * rstd, dxh = dyr[j] * gamma.d[j];
        s1 += dxh;
        s2 += dxh * xh;
        dg.d[j] += dyr[j] * xh;
        db.d[j] += dyr[j];
      }
      s1 /= D;
      s2 /= D;
      for (int64_t j = 0; j < D; ++j) {
        double xh = (xr[j] - mean) * rstd;
        dx.d[r * D + j] = rstd * (dyr[j] * gamma.d[j] - s1 - xh * s2);
      }
    }
    if (!grad) return one(y);
    return Ts{dx, dg, db};
  }

  static Result<Ts> crossEntropy(const Node& n, const std::vector<const Tensor*>& in) {
    bool grad = n.op() == OpKind::CrossEntropyGrad;
    const Tensor& logits = grad ? *in[1] : *in[0];
    const Tensor& targets = grad ? *in[2] : *in[1];
    int64_t V = logits.shape.back(), ignore = n.getInt("ignore_index");
    Tensor loss(targets.shape), dl(logits.shape);
    for (int64_t r = 0; r < targets.size(); ++r) {
      int64_t t = static_cast<int64_t>(targets.d[r]);
      if (t == ignore) continue;
      const double* l = &logits.d[r * V];
      double m = -INFINITY, z = 0;
      for (int64_t j = 0; j < V; ++j) m = std::max(m, l[j]);
      for (int64_t j = 0; j < V; ++j) z += std::exp(l[j] - m);
      loss.d[r] = std::log(z) + m - l[t];
      if (grad)
        for (int64_t j = 0; j < V; ++j) dl.d[r * V + j] = in[0]->d[r] * (std::exp(l[j] - m) / z - (j == t ? 1.0 : 0.0));
    }
    return one(grad ? dl : loss);
  }

  // Naive causal attention (no dropout) and its backward, from the recomputed probabilities.
  static Result<Ts> attention(const Node& n, const std::vector<const Tensor*>& in) {
    if (n.getFloat("dropout") != 0.0) return makeError("RefEval: attention with dropout is not implemented");
    bool grad = n.op() == OpKind::AttentionGrad;
    const Tensor &q = *in[grad ? 1 : 0], &k = *in[grad ? 2 : 1], &v = *in[grad ? 3 : 2];
    int64_t B = q.shape[0], H = q.shape[1], T = q.shape[2], S = k.shape[2], D = q.shape[3];
    double scale = n.getFloat("scale") == 0.0 ? 1.0 / std::sqrt(static_cast<double>(D)) : n.getFloat("scale");
    bool causal = n.getBool("causal");
    Tensor out(q.shape), lse(Shape{B, H, T}), dq(q.shape), dk(k.shape), dv(v.shape);
    for (int64_t bh = 0; bh < B * H; ++bh) {
      const double *Q = &q.d[bh * T * D], *K = &k.d[bh * S * D], *V = &v.d[bh * S * D];
      std::vector<double> P(T * S, 0.0);
      for (int64_t i = 0; i < T; ++i) {
        double m = -INFINITY, z = 0;
        std::vector<double> sc(S, -INFINITY);
        for (int64_t j = 0; j < S && (!causal || j <= i); ++j) {
          sc[j] = 0;
          for (int64_t c = 0; c < D; ++c) sc[j] += Q[i * D + c] * K[j * D + c];
          sc[j] *= scale;
          m = std::max(m, sc[j]);
        }
        for (int64_t j = 0; j < S; ++j) z += std::exp(sc[j] - m);
        lse.d[bh * T + i] = m + std::log(z);
        for (int64_t j = 0; j < S; ++j) P[i * S + j] = std::exp(sc[j] - m) / z;
        for (int64_t c = 0; c < D; ++c) {
          double o = 0;
          for (int64_t j = 0; j < S; ++j) o += P[i * S + j] * V[j * D + c];
          out.d[(bh * T + i) * D + c] = o;
        }
      }
      if (!grad) continue;
      const double* dO = &in[0]->d[bh * T * D];
      for (int64_t i = 0; i < T; ++i) {
        double rowDot = 0;  // sum_c dout * out
        for (int64_t c = 0; c < D; ++c) rowDot += dO[i * D + c] * out.d[(bh * T + i) * D + c];
        for (int64_t j = 0; j < S; ++j) {
          double dp = 0;
          for (int64_t c = 0; c < D; ++c) {
            dp += dO[i * D + c] * V[j * D + c];
            dv.d[(bh * S + j) * D + c] += P[i * S + j] * dO[i * D + c];
          }
          double ds = P[i * S + j] * (dp - rowDot) * scale;
          for (int64_t c = 0; c < D; ++c) {
            dq.d[(bh * T + i) * D + c] += ds * K[j * D + c];
            dk.d[(bh * S + j) * D + c] += ds * Q[i * D + c];
          }
        }
      }
    }
    if (grad) return Ts{dq, dk, dv};
    return Ts{out, lse};
  }

  static Result<Ts> matmul(const Node& n, const Tensor& a, const Tensor& b) {
    bool tA = n.getBool("transpose_a"), tB = n.getBool("transpose_b");
    const Shape& out = n.result()->shape();
    size_t r = out.size();
    int64_t M = out[r - 2], N = out[r - 1];
    int64_t K = tA ? a.shape[a.shape.size() - 2] : a.shape.back();
    llvm::ArrayRef<int64_t> batch = llvm::ArrayRef<int64_t>(out).drop_back(2);
    llvm::ArrayRef<int64_t> ab = llvm::ArrayRef<int64_t>(a.shape).drop_back(2), bb = llvm::ArrayRef<int64_t>(b.shape).drop_back(2);
    int64_t aRows = a.shape[a.shape.size() - 2], aCols = a.shape.back();
    int64_t bRows = b.shape[b.shape.size() - 2], bCols = b.shape.back();
    Tensor y(out);
    for (int64_t bi = 0; bi < Tensor::numel(batch); ++bi) {
      auto idx = unravel(bi, batch);
      int64_t ao = bcastIndex(idx, batch, ab) * aRows * aCols, bo = bcastIndex(idx, batch, bb) * bRows * bCols;
      for (int64_t i = 0; i < M; ++i)
        for (int64_t j = 0; j < N; ++j) {
          double s = 0;
          for (int64_t k = 0; k < K; ++k) {
            double av = tA ? a.d[ao + k * aCols + i] : a.d[ao + i * aCols + k];
            double bv = tB ? b.d[bo + j * bCols + k] : b.d[bo + k * bCols + j];
            s += av * bv;
          }
          y.d[(bi * M + i) * N + j] = s;
        }
    }
    return one(y);
  }

  std::map<const Value*, Tensor> env_;
};

// ---- gradient checks ----------------------------------------------------------------------------

std::unique_ptr<Graph> parse(const std::string& text) {
  auto g = parseGraph(text, "<test>");
  INFO(text);
  REQUIRE(g.ok());
  return std::move(g).value();
}

Tensor randomTensor(const Shape& s, std::mt19937& rng, double lo, double hi) {
  Tensor t(s);
  std::uniform_real_distribution<double> u(lo, hi);
  for (double& v : t.d) v = u(rng);
  return t;
}

struct GradCheckOptions {
  double lo = -1.0, hi = 1.0;              // random float inputs are drawn from [lo, hi)
  std::map<std::string, Tensor> given{};   // fixed values by input name (integer ids, ...)
  int coordsPerInput = 6;                  // finite differences on this many random coordinates of each
};

// Treats the graph's first output y as the function under test: loss = sum(y * r) for a random r, then
// compares appendGradients' d loss / d x, for every float input and param x, with central differences
// (h = 1e-6, fp64) on random coordinates. The error is |analytic - numeric| / max(|analytic|, |numeric|, 1e-3).
void checkGradients(const std::string& text, GradCheckOptions opt = {}) {
  INFO(text);
  auto g = parse(text);
  Value* y = g->outputs()[0].value;
  Value* r = g->addInput("r", y->type());
  Value* prod = (*g->create(OpKind::Mul, {y, r}))->result();
  std::vector<int64_t> all;
  for (int64_t k = 0; k < y->type().rank(); ++k) all.push_back(k);
  AttrDict ra;
  ra.set("axes", all);
  Value* loss = (*g->create(OpKind::ReduceSum, {prod}, ra))->result();
  std::vector<Value*> wrt;
  for (Value* v : g->inputs())
    if (v != r && isFloat(v->dtype())) wrt.push_back(v);
  for (Value* v : g->params()) wrt.push_back(v);
  auto grads = appendGradients(*g, loss, wrt);
  INFO((grads.ok() ? std::string() : grads.error()));
  REQUIRE(grads.ok());
  g->clearOutputs();
  g->addOutput(loss, "loss");
  for (Value* d : *grads) g->addOutput(d);
  std::string printed = printGraph(*g);
  INFO(printed);

  std::mt19937 rng(42);
  std::map<const Value*, Tensor> args;
  auto fill = [&](Value* v) {
    auto it = opt.given.find(v->name());
    args[v] = it != opt.given.end() ? it->second : randomTensor(v->shape(), rng, opt.lo, opt.hi);
    args[v].shape = v->shape();
  };
  for (Value* v : g->inputs()) fill(v);
  for (Value* v : g->params()) fill(v);
  args[r] = randomTensor(r->shape(), rng, -1.0, 1.0);

  RefEval ev;
  auto base = ev.run(*g, args);
  INFO((base.ok() ? std::string() : base.error()));
  REQUIRE(base.ok());
  auto lossAt = [&](const Value* v, int64_t i, double delta) {
    auto a = args;
    a[v].d[i] += delta;
    auto out = ev.run(*g, a);
    REQUIRE(out.ok());
    return (*out)[0].d[0];
  };
  const double h = 1e-6;
  double worst = 0;
  for (size_t w = 0; w < wrt.size(); ++w) {
    const Tensor& analytic = (*base)[1 + w];
    REQUIRE(analytic.shape == wrt[w]->shape());
    std::uniform_int_distribution<int64_t> pick(0, analytic.size() - 1);
    for (int c = 0; c < std::min<int64_t>(opt.coordsPerInput, analytic.size()); ++c) {
      int64_t i = analytic.size() <= opt.coordsPerInput ? c : pick(rng);
      double numeric = (lossAt(wrt[w], i, h) - lossAt(wrt[w], i, -h)) / (2 * h);
      double a = analytic.d[i];
      double err = std::abs(a - numeric) / std::max({std::abs(a), std::abs(numeric), 1e-3});
      INFO("d/d" << wrt[w]->name() << "[" << i << "]: analytic " << a << ", numeric " << numeric);
      CHECK(err < 1e-6);
      worst = test::worseOf(worst, err);
    }
  }
  UNSCOPED_INFO("worst relative error " << worst);
}

TEST_CASE("autodiff: unary elementwise VJPs match finite differences", "[autodiff]") {
  checkGradients("graph @t(%x: f64[3,4]) { %y = neg(%x) : f64[3,4]  return %y }");
  checkGradients("graph @t(%x: f64[3,4]) { %y = exp(%x) : f64[3,4]  return %y }");
  checkGradients("graph @t(%x: f64[3,4]) { %y = tanh(%x) : f64[3,4]  return %y }");
  checkGradients("graph @t(%x: f64[3,4]) { %y = gelu(%x) : f64[3,4]  return %y }", {.lo = -3, .hi = 3});
  checkGradients("graph @t(%x: f64[3,4]) { %y = scale(%x) {factor=-2.5} : f64[3,4]  return %y }");
  checkGradients("graph @t(%x: f64[3,4]) { %y = cast(%x) {to=f64} : f64[3,4]  return %y }");
  GradCheckOptions positive{.lo = 0.5, .hi = 2.0};
  checkGradients("graph @t(%x: f64[3,4]) { %y = log(%x) : f64[3,4]  return %y }", positive);
  checkGradients("graph @t(%x: f64[3,4]) { %y = sqrt(%x) : f64[3,4]  return %y }", positive);
  checkGradients("graph @t(%x: f64[3,4]) { %y = rsqrt(%x) : f64[3,4]  return %y }", positive);
  checkGradients("graph @t(%x: f64[6,5]) { %y = dropout(%x) {p=0.3, key=7} : f64[6,5]  return %y }",
                 {.coordsPerInput = 30});
}

TEST_CASE("autodiff: broadcasting binary VJPs reduce back to each operand's shape", "[autodiff]") {
  for (const char* op : {"add", "sub", "mul", "div"}) {
    std::string o(op);
    GradCheckOptions opt{.lo = 0.5, .hi = 2.0};
    checkGradients("graph @t(%a: f64[3,4], %b: f64[3,4]) { %y = " + o + "(%a, %b) : f64[3,4]  return %y }", opt);
    checkGradients("graph @t(%a: f64[2,3,4], %b: f64[4]) { %y = " + o + "(%a, %b) : f64[2,3,4]  return %y }", opt);
    checkGradients("graph @t(%a: f64[2,1,4], %b: f64[3,1]) { %y = " + o + "(%a, %b) : f64[2,3,4]  return %y }", opt);
    checkGradients("graph @t(%a: f64[], %b: f64[2,3]) { %y = " + o + "(%a, %b) : f64[2,3]  return %y }", opt);
  }
}

TEST_CASE("autodiff: a value with several users accumulates its cotangents", "[autodiff]") {
  checkGradients(R"(graph @t(%x: f64[3,4], %w: f64[4]) {
    %a = mul(%x, %x) : f64[3,4]
    %b = mul(%a, %w) : f64[3,4]
    %c = tanh(%x) : f64[3,4]
    %y = add(%b, %c) : f64[3,4]
    return %y })");
}

TEST_CASE("autodiff: matmul VJP with transposes and batch broadcast", "[autodiff]") {
  checkGradients("graph @t(%a: f64[3,4], %b: f64[4,5]) { %y = matmul(%a, %b) : f64[3,5]  return %y }");
  checkGradients("graph @t(%a: f64[4,3], %b: f64[4,5]) { %y = matmul(%a, %b) {transpose_a=true} : f64[3,5]  return %y }");
  checkGradients("graph @t(%a: f64[3,4], %b: f64[5,4]) { %y = matmul(%a, %b) {transpose_b=true} : f64[3,5]  return %y }");
  checkGradients(
      "graph @t(%a: f64[4,3], %b: f64[5,4]) { %y = matmul(%a, %b) {transpose_a=true, transpose_b=true} : f64[3,5]  return %y }");
  checkGradients("graph @t(%a: f64[2,3,4], %b: f64[4,5]) { %y = matmul(%a, %b) : f64[2,3,5]  return %y }");
  checkGradients("graph @t(%a: f64[3,4], %b: f64[2,4,5]) { %y = matmul(%a, %b) : f64[2,3,5]  return %y }");
  checkGradients(
      "graph @t(%a: f64[2,1,4,3], %b: f64[3,5,4]) { %y = matmul(%a, %b) {transpose_a=true, transpose_b=true} : f64[2,3,3,5]  return %y }");
}

TEST_CASE("autodiff: layer_norm, softmax and cross_entropy VJPs", "[autodiff]") {
  checkGradients(
      "graph @t(%x: f64[2,3,6], %g: f64[6], %b: f64[6]) { %y = layer_norm(%x, %g, %b) {eps=1e-5} : f64[2,3,6]  return %y }");
  checkGradients("graph @t(%x: f64[3,5]) { %y = softmax(%x) : f64[3,5]  return %y }");
  checkGradients("graph @t(%x: f64[4,3,2]) { %y = softmax(%x) {axis=1} : f64[4,3,2]  return %y }");
  Tensor targets(Shape{2, 3});
  targets.d = {0, 4, 2, -1, 3, 1};  // one ignored position
  checkGradients("graph @t(%l: f64[2,3,5], %t: i32[2,3]) { %y = cross_entropy(%l, %t) : f32[2,3]  return %y }",
                 {.given = {{"t", targets}}});
}

TEST_CASE("autodiff: attention VJP matches finite differences (causal and not, default and given scale)", "[autodiff]") {
  checkGradients(R"(graph @t(%q: f64[2,2,4,3], %k: f64[2,2,4,3], %v: f64[2,2,4,3]) {
    %o, %lse = attention(%q, %k, %v) {causal=true} : f64[2,2,4,3], f32[2,2,4]
    return %o })");
  checkGradients(R"(graph @t(%q: f64[1,2,3,4], %k: f64[1,2,5,4], %v: f64[1,2,5,4]) {
    %o, %lse = attention(%q, %k, %v) {causal=false, scale=0.7} : f64[1,2,3,4], f32[1,2,3]
    return %o })");
}

TEST_CASE("autodiff: embedding VJP scatters into the table rows, honoring vocab_start", "[autodiff]") {
  Tensor ids(Shape{2, 4});
  ids.d = {0, 3, 3, 1, 5, 2, 0, 9};  // repeats; 9 is outside the table
  checkGradients("graph @t(%w: f64[6,3], %i: i32[2,4]) { %y = embedding(%w, %i) : f64[2,4,3]  return %y }",
                 {.given = {{"i", ids}}, .coordsPerInput = 18});
  checkGradients("graph @t(%w: f64[4,3], %i: i32[2,4]) { %y = embedding(%w, %i) {vocab_start=2} : f64[2,4,3]  return %y }",
                 {.given = {{"i", ids}}, .coordsPerInput = 12});
}

TEST_CASE("autodiff: movement and reduction VJPs", "[autodiff]") {
  checkGradients("graph @t(%x: f64[2,3,4]) { %y = reshape(%x) {shape=[4,-1]} : f64[4,6]  return %y }");
  checkGradients("graph @t(%x: f64[2,3,4]) { %y = transpose(%x) {perm=[2,0,1]} : f64[4,2,3]  return %y }");
  checkGradients("graph @t(%x: f64[2,5,3]) { %y = slice(%x) {axis=1, start=1, end=3} : f64[2,2,3]  return %y }");
  checkGradients("graph @t(%x: f64[2,5,3]) { %y = slice(%x) {axis=-1, start=0, end=2} : f64[2,5,2]  return %y }");
  checkGradients(
      "graph @t(%a: f64[2,1,3], %b: f64[2,4,3]) { %y = concat(%a, %b, %a) {axis=1} : f64[2,6,3]  return %y }");
  checkGradients("graph @t(%x: f64[3,1]) { %y = broadcast_to(%x) {shape=[2,3,4]} : f64[2,3,4]  return %y }");
  checkGradients("graph @t(%x: f64[2,3,4]) { %y = reduce_sum(%x) {axes=[0,2]} : f64[3]  return %y }");
  checkGradients("graph @t(%x: f64[2,3,4]) { %y = reduce_sum(%x) {axes=[1], keepdims=true} : f64[2,1,4]  return %y }");
  checkGradients("graph @t(%x: f64[2,3,4]) { %y = reduce_mean(%x) {axes=[-1]} : f64[2,3]  return %y }");
  checkGradients("graph @t(%x: f64[2,3,4]) { %y = reduce_mean(%x) {axes=[0,1,2]} : f64[]  return %y }");
}

TEST_CASE("autodiff: a small MLP with a loss, end to end", "[autodiff]") {
  Tensor targets(Shape{4});
  targets.d = {1, 0, 2, 1};
  checkGradients(R"(graph @t(%x: f64[4,3], %t: i32[4]) params(%w1: f64[3,8], %b1: f64[8], %g: f64[8], %be: f64[8],
                                                                %w2: f64[8,3]) {
    %h0 = matmul(%x, %w1) : f64[4,8]
    %h1 = add(%h0, %b1) : f64[4,8]
    %h2 = layer_norm(%h1, %g, %be) : f64[4,8]
    %h3 = gelu(%h2) : f64[4,8]
    %lg = matmul(%h3, %w2) : f64[4,3]
    %ls = cross_entropy(%lg, %t) : f32[4]
    %l = reduce_mean(%ls) {axes=[0]} : f32[]
    return %l })",
                 {.given = {{"t", targets}}});
}

// ---- structure and errors -----------------------------------------------------------------------

int countOps(const Graph& g, OpKind k) {
  int c = 0;
  for (const Node* n : g.nodes()) c += n->op() == k;
  return c;
}
const Node* firstOp(const Graph& g, OpKind k) {
  for (const Node* n : g.nodes())
    if (n->op() == k) return n;
  return nullptr;
}

TEST_CASE("autodiff: attention VJP reads the forward's out and lse", "[autodiff]") {
  auto g = parse(R"(graph @t(%q: f32[1,2,4,8], %k: f32[1,2,4,8], %v: f32[1,2,4,8]) {
    %o, %lse = attention(%q, %k, %v) {causal=true, dropout=0.1, key=3} : f32[1,2,4,8], f32[1,2,4]
    %l = reduce_sum(%o) {axes=[0,1,2,3]} : f32[]
    return %l })");
  Value* l = g->outputs()[0].value;
  auto grads = appendGradients(*g, l, {g->inputs()[0], g->inputs()[1], g->inputs()[2]});
  REQUIRE(grads.ok());
  const Node* fwd = firstOp(*g, OpKind::Attention);
  const Node* bwd = firstOp(*g, OpKind::AttentionGrad);
  REQUIRE(bwd);
  CHECK(bwd->operand(4) == fwd->result(0));
  CHECK(bwd->operand(5) == fwd->result(1));
  CHECK(bwd->attrs() == fwd->attrs());
  for (int i = 0; i < 3; ++i) CHECK((*grads)[i] == bwd->result(i));

  // A loss that reads lse cannot be differentiated through attention_grad: a clear error.
  auto g2 = parse(R"(graph @t(%q: f32[1,2,4,8]) {
    %o, %lse = attention(%q, %q, %q) : f32[1,2,4,8], f32[1,2,4]
    %l = reduce_sum(%lse) {axes=[0,1,2]} : f32[]
    return %l })");
  auto bad = appendGradients(*g2, g2->outputs()[0].value, {g2->inputs()[0]});
  REQUIRE_FALSE(bad.ok());
  CHECK_THAT(bad.error(), Catch::Contains("'attention'") && Catch::Contains("lse"));
}

TEST_CASE("autodiff: collective VJPs (all_reduce -> all_reduce, all_gather <-> reduce_scatter)", "[autodiff]") {
  auto g = parse(R"(graph @t(%x: f32[4,6]) mesh(tp=2) {
    %a = all_reduce(%x) {axis=tp, op=sum} : f32[4,6]
    %b = all_gather(%a) {axis=tp, dim=1} : f32[4,12]
    %c = reduce_scatter(%b) {axis=tp, dim=0, op=sum} : f32[2,12]
    %l = reduce_sum(%c) {axes=[0,1]} : f32[]
    return %l })");
  auto grads = appendGradients(*g, g->outputs()[0].value, {g->inputs()[0]});
  REQUIRE(grads.ok());
  // Forward: one of each. Backward adds: all_gather(dim 0) for reduce_scatter, reduce_scatter(dim 1) for
  // all_gather, all_reduce for all_reduce.
  CHECK(countOps(*g, OpKind::AllReduce) == 2);
  CHECK(countOps(*g, OpKind::AllGather) == 2);
  CHECK(countOps(*g, OpKind::ReduceScatter) == 2);
  Node* last = (*grads)[0]->def();
  REQUIRE(last->op() == OpKind::AllReduce);
  CHECK(last->getStr("op") == "sum");
  Node* rs = last->operand(0)->def();
  REQUIRE(rs->op() == OpKind::ReduceScatter);
  CHECK(rs->getInt("dim") == 1);
  CHECK(rs->operand(0)->def()->op() == OpKind::AllGather);
  CHECK(rs->operand(0)->def()->getInt("dim") == 0);

  auto g2 = parse(R"(graph @t(%x: f32[4]) mesh(tp=2) {
    %a = all_reduce(%x) {axis=tp, op=max} : f32[4]
    %l = reduce_sum(%a) {axes=[0]} : f32[]
    return %l })");
  auto bad = appendGradients(*g2, g2->outputs()[0].value, {g2->inputs()[0]});
  REQUIRE_FALSE(bad.ok());
  CHECK_THAT(bad.error(), Catch::Contains("all_reduce") && Catch::Contains("op=sum"));
}

TEST_CASE("autodiff: errors name the op, unused and integer values", "[autodiff]") {
  auto g = parse(R"(graph @t(%x: f32[3,4], %u: f32[2], %i: i32[3]) {
    %m = reduce_max(%x) {axes=[1]} : f32[3]
    %l = reduce_sum(%m) {axes=[0]} : f32[]
    return %l })");
  auto bad = appendGradients(*g, g->outputs()[0].value, {g->inputs()[0]});
  REQUIRE_FALSE(bad.ok());
  CHECK_THAT(bad.error(), Catch::Contains("'reduce_max'"));

  // reduce_max off the path from wrt is fine; a value the loss does not read gets zeros.
  auto g2 = parse(R"(graph @t(%x: f32[3,4], %u: f32[2], %i: i32[3]) {
    %m = reduce_max(%x) {axes=[1]} : f32[3]
    %l = reduce_sum(%m) {axes=[0]} : f32[]
    return %l })");
  auto ok = appendGradients(*g2, g2->outputs()[0].value, {g2->inputs()[1]});
  REQUIRE(ok.ok());
  const Node* z = (*ok)[0]->def();
  REQUIRE(z->op() == OpKind::Full);
  CHECK(z->getFloat("value") == 0.0);
  CHECK((*ok)[0]->type() == g2->inputs()[1]->type());
  CHECK((*ok)[0]->name() == "d.u");

  auto intWrt = appendGradients(*g2, g2->outputs()[0].value, {g2->inputs()[2]});
  REQUIRE_FALSE(intWrt.ok());
  CHECK_THAT(intWrt.error(), Catch::Contains("'i'"));
}

const char* kSmall = R"(graph @small(%x: f32[4,8], %t: i32[4]) params(%w: f32[8,16] init=normal(0.02), %b: f32[16] init=zeros) {
  %h0 = matmul(%x, %w) : f32[4,16]
  %h = add(%h0, %b) : f32[4,16]
  %a = gelu(%h) : f32[4,16]
  %ls = cross_entropy(%a, %t) : f32[4]
  %loss = reduce_mean(%ls) {axes=[0]} : f32[]
  return %loss
})";

std::vector<std::string> outputNames(const Graph& g) {
  std::vector<std::string> v;
  for (size_t i = 0; i < g.outputs().size(); ++i) v.push_back(g.outputName(i));
  return v;
}

TEST_CASE("training step: inputs, params and outputs follow autodiff.h", "[autodiff]") {
  auto g = parse(kSmall);
  REQUIRE(buildTrainingStep(*g, {}).ok());
  CHECK(outputNames(*g) == std::vector<std::string>{"loss", "grad_norm", "w", "w.adam_m", "w.adam_v", "b", "b.adam_m",
                                                    "b.adam_v"});
  REQUIRE(g->inputs().size() == 4);
  CHECK(g->inputs()[0]->type().str() == "f32[4,8]");
  CHECK(g->inputs()[2]->name() == "lr");
  CHECK(g->inputs()[3]->name() == "step");
  CHECK(g->inputs()[2]->type().str() == "f32[]");
  REQUIRE(g->params().size() == 6);
  std::vector<std::string> pnames;
  for (Value* p : g->params()) pnames.push_back(p->name());
  CHECK(pnames == std::vector<std::string>{"w", "b", "w.adam_m", "w.adam_v", "b.adam_m", "b.adam_v"});
  CHECK(g->params()[2]->init().kind == "zeros");
  CHECK(g->params()[2]->type() == g->params()[0]->type());
  CHECK(countOps(*g, OpKind::GlobalNorm) == 1);
  CHECK(countOps(*g, OpKind::ClipScale) == 1);
  CHECK(countOps(*g, OpKind::AdamWUpdate) == 2);
  // The step is a valid graph: printing and parsing it back verifies it.
  std::string text = printGraph(*g);
  auto back = parseGraph(text, "<step>");
  INFO(text);
  REQUIRE(back.ok());
  CHECK(printGraph(**back) == text);
}

TEST_CASE("training step: weight decay only for parameters of rank >= 2 not named *.bias", "[autodiff]") {
  auto g = parse(kSmall);
  TrainingStepOptions o;
  o.weightDecay = 0.25;
  o.beta1 = 0.8;
  REQUIRE(buildTrainingStep(*g, o).ok());
  for (const Node* n : g->nodes()) {
    if (n->op() != OpKind::AdamWUpdate) continue;
    const std::string& name = n->operand(0)->name();
    bool bias = name.size() >= 5 && name.substr(name.size() - 5) == ".bias";
    double expected = n->operand(0)->type().rank() >= 2 && !bias ? 0.25 : 0.0;
    CHECK(n->getFloat("weight_decay") == expected);
    CHECK(n->getFloat("beta1") == 0.8);
  }
}

TEST_CASE("training step: clip-grad 0 disables clipping but still reports grad_norm", "[autodiff]") {
  auto g = parse(kSmall);
  TrainingStepOptions o;
  o.clipGrad = 0;
  REQUIRE(buildTrainingStep(*g, o).ok());
  CHECK(countOps(*g, OpKind::ClipScale) == 0);
  CHECK(countOps(*g, OpKind::GlobalNorm) == 1);
  // Unclipped: adamw reads the gradients global_norm read.
  const Node* norm = firstOp(*g, OpKind::GlobalNorm);
  for (const Node* n : g->nodes())
    if (n->op() == OpKind::AdamWUpdate)
      CHECK(std::find(norm->operands().begin(), norm->operands().end(), n->operand(1)) != norm->operands().end());
}

TEST_CASE("training step: micro-batches are sliced from a leading [accum] dim, forward+backward each in turn", "[autodiff]") {
  auto g = parse(kSmall);
  TrainingStepOptions o;
  o.accumSteps = 3;
  REQUIRE(buildTrainingStep(*g, o).ok());
  CHECK(g->inputs()[0]->type().str() == "f32[3,4,8]");
  CHECK(g->inputs()[1]->type().str() == "i32[3,4]");
  CHECK(countOps(*g, OpKind::Slice) == 6);
  CHECK(countOps(*g, OpKind::Gelu) == 3);
  CHECK(countOps(*g, OpKind::GeluGrad) == 3);
  // Program order: gelu, gelu_grad, gelu, gelu_grad, ...: micro-batch i's backward runs before i+1's forward.
  std::vector<OpKind> order;
  for (const Node* n : g->nodes())
    if (n->op() == OpKind::Gelu || n->op() == OpKind::GeluGrad) order.push_back(n->op());
  CHECK(order == std::vector<OpKind>{OpKind::Gelu, OpKind::GeluGrad, OpKind::Gelu, OpKind::GeluGrad, OpKind::Gelu,
                                     OpKind::GeluGrad});
  // Slices of micro-batch i read [i, i+1) of the leading dim.
  std::vector<int64_t> starts;
  for (const Node* n : g->nodes())
    if (n->op() == OpKind::Slice && n->operand(0) == g->inputs()[0]) starts.push_back(n->getInt("start"));
  CHECK(starts == std::vector<int64_t>{0, 1, 2});
  // loss and gradients are means over micro-batches.
  const Value* loss = g->outputs()[0].value;
  REQUIRE(loss->def()->op() == OpKind::Scale);
  CHECK(loss->def()->getFloat("factor") == Approx(1.0 / 3));
  const Node* norm = firstOp(*g, OpKind::GlobalNorm);
  for (Value* d : norm->operands()) {
    REQUIRE(d->def()->op() == OpKind::Scale);
    CHECK(d->def()->getFloat("factor") == Approx(1.0 / 3));
  }
  auto back = parseGraph(printGraph(*g), "<step>");
  CHECK(back.ok());
}

TEST_CASE("training step: more micro-batches than the unrolled bound is one error, nothing built", "[autodiff]") {
  auto g = parse(kSmall);
  const int64_t ops = g->numNodes(), most = kMaxUnrolledForwardNodes / ops;
  TrainingStepOptions o;
  o.accumSteps = most + 1;
  Status s = buildTrainingStep(*g, o);
  REQUIRE_FALSE(s.ok());
  CHECK(s.error() == cat("autodiff: accum=", most + 1, " micro-batches a step is more than this model's ", most,
                         " (the step holds each micro-batch's forward of ", ops, " ops, at most ",
                         kMaxUnrolledForwardNodes, " in all): raise --micro-batch-size or lower --global-batch-size "
                         "(global = micro x accumulation x dp)"));
  CHECK(countOps(*g, OpKind::Slice) == 0);
  // Below the bound it builds.
  auto h = parse(kSmall);
  o.accumSteps = 8;
  CHECK(buildTrainingStep(*h, o).ok());
}

TEST_CASE("training step: accum=2 on half batches equals accum=1 on the whole batch (fp64)", "[autodiff]") {
  const char* text = R"(graph @m(%x: f64[B,3], %t: i32[B]) params(%w: f64[3,5], %b: f64[5]) {
    %h0 = matmul(%x, %w) : f64[B,5]
    %h = add(%h0, %b) : f64[B,5]
    %a = tanh(%h) : f64[B,5]
    %ls = cross_entropy(%a, %t) : f32[B]
    %loss = reduce_mean(%ls) {axes=[0]} : f32[]
    return %loss })";
  auto withBatch = [&](int b) {
    std::string s = text;
    for (size_t p; (p = s.find('B')) != std::string::npos;) s.replace(p, 1, std::to_string(b));
    return parse(s);
  };
  auto full = withBatch(4), half = withBatch(2);
  REQUIRE(buildTrainingStep(*full, {}).ok());
  TrainingStepOptions o;
  o.accumSteps = 2;
  REQUIRE(buildTrainingStep(*half, o).ok());

  std::mt19937 rng(7);
  Tensor x = randomTensor({4, 3}, rng, -1, 1), t(Shape{4}), lr(Shape{}), step(Shape{});
  t.d = {0, 4, 2, 1};
  lr.d = {1e-2};
  step.d = {3};
  std::vector<Tensor> params = {randomTensor({3, 5}, rng, -1, 1), randomTensor({5}, rng, -1, 1)};
  auto run = [&](Graph& g, bool split) {
    std::map<const Value*, Tensor> args;
    args[g.inputs()[0]] = x;
    args[g.inputs()[1]] = t;
    if (split) {
      args[g.inputs()[0]].shape = {2, 2, 3};
      args[g.inputs()[1]].shape = {2, 2};
    }
    args[g.inputs()[2]] = lr;
    args[g.inputs()[3]] = step;
    for (size_t k = 0; k < g.params().size(); ++k)
      args[g.params()[k]] = k < 2 ? params[k] : randomTensor(g.params()[k]->shape(), rng, 0, 0.1);
    RefEval ev;
    auto out = ev.run(g, args);
    REQUIRE(out.ok());
    return *out;
  };
  // Same moments in both runs: reseed before each.
  rng.seed(11);
  auto a = run(*full, false);
  rng.seed(11);
  auto b = run(*half, true);
  REQUIRE(a.size() == b.size());
  for (size_t k = 0; k < a.size(); ++k) {
    INFO("output " << full->outputName(k));
    REQUIRE(a[k].size() == b[k].size());
    for (int64_t i = 0; i < a[k].size(); ++i) CHECK(a[k].d[i] == Approx(b[k].d[i]).epsilon(1e-12).margin(1e-14));
  }
}

TEST_CASE("training step: user errors name the thing and the fix", "[autodiff]") {
  auto g = parse(kSmall);
  TrainingStepOptions o;
  o.lossOutput = "nll";
  Status s = buildTrainingStep(*g, o);
  REQUIRE_FALSE(s.ok());
  CHECK_THAT(s.error(), Catch::Contains("'nll'") && Catch::Contains("loss"));

  auto g2 = parse(R"(graph @t(%x: f32[3]) params(%w: f32[3]) { %y = mul(%x, %w) : f32[3]  return %y })");
  TrainingStepOptions y;
  y.lossOutput = "y";
  s = buildTrainingStep(*g2, y);
  REQUIRE_FALSE(s.ok());
  CHECK_THAT(s.error(), Catch::Contains("f32[3]"));
}

TEST_CASE("autodiff pass: registered with its options, runs from a pipeline", "[autodiff]") {
  auto r = test::runCommand(test::tpcBinary() + " opt " + test::sourcePath("tests/ir/gpt_block.tir") +
                            " --passes='autodiff(accum=2,clip-grad=0.5,weight-decay=0.01),cse,dce'");
  INFO(r.err);
  REQUIRE(r.exitCode == 0);
  CHECK_THAT(r.out, Catch::Contains("%tokens: i32[2,2,16]") && Catch::Contains("attention_grad(") &&
                        Catch::Contains("embedding_grad(") && Catch::Contains("layer_norm_grad(") &&
                        Catch::Contains("cross_entropy_grad(") && Catch::Contains("{max_norm=0.5}") &&
                        Catch::Contains("weight_decay=0.01") && Catch::Contains("wte.adam_v="));
  auto bad = test::runCommand(test::tpcBinary() + " opt " + test::sourcePath("tests/ir/gpt_block.tir") +
                              " --passes='autodiff(accum=0)'");
  CHECK(bad.exitCode != 0);
  CHECK_THAT(bad.err, Catch::Contains("accum"));
}

// The whole GPT block on the CPU reference executor in fp64: appendGradients against finite differences.
TEST_CASE("autodiff: GPT block gradients match finite differences on the CPU executor (fp64)", "[autodiff][cpu]") {
  auto parsed = parseGraphFile(test::sourcePath("tests/ir/gpt_block.tir"));
  REQUIRE(parsed.ok());
  auto r = test::gradcheckGraph(**parsed, "loss", 128, 3, 3,
                                [](const std::string& n) { return n.find("_g") != std::string::npos; });
  INFO("worst: " << r.worst);
  CHECK(r.checked == 3 * 16);
  CHECK(r.worstRelError < 1e-6);
}

}  // namespace
}  // namespace tpc
