// Helpers for the CPU backend tests: one-op graphs, random tensors, element access in double, and a
// central finite-difference gradient.
#pragma once

#include <cmath>
#include <functional>
#include <random>
#include <vector>

#include <catch2/catch.hpp>

#include "ir/graph.h"
#include "runtime/cpu/cpu_executor.h"
#include "runtime/host_tensor.h"
#include "worst_error.h"

namespace tpc::test {

inline std::vector<double> values(const HostTensor& t) {
  std::vector<double> v(static_cast<size_t>(t.numel()));
  for (int64_t i = 0; i < t.numel(); ++i) v[i] = t.getAsDouble(i);
  return v;
}

// A tensor of `type` (floats stored as f64 when fp64) with uniform values in [lo, hi) (integers: [lo, hi]).
inline HostTensor randomTensor(const TensorType& type, std::mt19937& rng, bool fp64, double lo = -1, double hi = 1) {
  DType d = isFloat(type.dtype) ? (fp64 ? DType::f64 : DType::f32) : type.dtype;
  HostTensor t(TensorType(d, type.shape));
  if (isFloat(type.dtype)) {
    std::uniform_real_distribution<double> u(lo, hi);
    for (int64_t i = 0; i < t.numel(); ++i) t.setFromDouble(i, u(rng));
  } else {
    std::uniform_int_distribution<int64_t> u(static_cast<int64_t>(lo), static_cast<int64_t>(hi));
    for (int64_t i = 0; i < t.numel(); ++i) t.setFromDouble(i, static_cast<double>(u(rng)));
  }
  return t;
}

inline HostTensor fromValues(const TensorType& type, const std::vector<double>& v, bool fp64) {
  DType d = isFloat(type.dtype) ? (fp64 ? DType::f64 : DType::f32) : type.dtype;
  HostTensor t(TensorType(d, type.shape));
  for (int64_t i = 0; i < t.numel(); ++i) t.setFromDouble(i, v[i]);
  return t;
}

// A graph holding one node of `op` on inputs of the given types; its outputs are the node's results.
struct OneOp {
  std::unique_ptr<Graph> graph;
  Node* node = nullptr;
};
inline OneOp oneOp(OpKind op, const std::vector<TensorType>& types, AttrDict attrs = {}, Mesh mesh = {}) {
  OneOp o{std::make_unique<Graph>("t"), nullptr};
  o.graph->setMesh(std::move(mesh));
  std::vector<Value*> ins;
  for (size_t k = 0; k < types.size(); ++k) ins.push_back(o.graph->addInput("in" + std::to_string(k), types[k]));
  auto n = o.graph->create(op, ins, std::move(attrs));
  if (!n.ok()) FAIL(n.error());
  o.node = *n;
  for (Value* r : o.node->results()) o.graph->addOutput(r);
  return o;
}

inline Result<std::vector<HostTensor>> runGraph(const Graph& g, const std::vector<HostTensor>& inputs, bool fp64,
                                                int64_t step = 0, int threads = 2) {
  CpuOptions opt;
  opt.fp64 = fp64;
  opt.threads = threads;
  TPC_ASSIGN(auto exec, CpuExecutor::create(g, opt));
  std::vector<const HostTensor*> in;
  for (const HostTensor& t : inputs) in.push_back(&t);
  return exec->run(in, {}, step);
}

// Runs one op and returns its results (REQUIREs success).
inline std::vector<HostTensor> runOp(OpKind op, const std::vector<HostTensor>& inputs, AttrDict attrs = {},
                                     bool fp64 = false, int64_t step = 0) {
  std::vector<TensorType> types;
  for (const HostTensor& t : inputs) {
    DType d = t.dtype() == DType::f64 ? DType::f32 : t.dtype();
    types.push_back(TensorType(d, t.shape()));
  }
  OneOp o = oneOp(op, types, std::move(attrs));
  auto r = runGraph(*o.graph, inputs, fp64, step);
  if (!r.ok()) FAIL(r.error());
  return std::move(r).value();
}

// Largest |a - b| / (|b| + atol); a NaN is infinitely wrong.
inline double maxRelErr(const std::vector<double>& a, const std::vector<double>& b, double atol = 1e-6) {
  REQUIRE(a.size() == b.size());
  return worstRelError(a, b, atol);
}

// ||a - b|| / ||b||
inline double normRelErr(const std::vector<double>& a, const std::vector<double>& b) {
  REQUIRE(a.size() == b.size());
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num += (a[i] - b[i]) * (a[i] - b[i]);
    den += b[i] * b[i];
  }
  return std::sqrt(num / std::max(den, 1e-300));
}

// Central differences of a scalar function of args[which] (f64 tensors), step h.
inline std::vector<double> numericGrad(const std::function<double(const std::vector<HostTensor>&)>& f,
                                       std::vector<HostTensor> args, size_t which, double h = 1e-5) {
  HostTensor x = args[which].clone();
  args[which] = x;
  std::vector<double> g(static_cast<size_t>(x.numel()));
  for (int64_t i = 0; i < x.numel(); ++i) {
    double v = x.getAsDouble(i);
    x.setFromDouble(i, v + h);
    double fp = f(args);
    x.setFromDouble(i, v - h);
    double fm = f(args);
    x.setFromDouble(i, v);
    g[i] = (fp - fm) / (2 * h);
  }
  return g;
}

// sum(t * w)
inline double dot(const HostTensor& t, const HostTensor& w) {
  double s = 0;
  for (int64_t i = 0; i < t.numel(); ++i) s += t.getAsDouble(i) * w.getAsDouble(i);
  return s;
}

inline TensorType f32(Shape s) { return TensorType(DType::f32, std::move(s)); }
inline TensorType i32(Shape s) { return TensorType(DType::i32, std::move(s)); }

}  // namespace tpc::test
