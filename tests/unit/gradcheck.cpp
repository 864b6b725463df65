// Whole-graph gradient checks on the CPU executor in fp64.
#include "gradcheck.h"

#include <algorithm>
#include <cmath>
#include <random>
#include <sstream>

#include "ir/assert.h"
#include "passes/autodiff.h"
#include "runtime/cpu/cpu_executor.h"
#include "worst_error.h"

namespace tpc::test {

GradcheckResult gradcheckGraph(Graph& g, const std::string& lossName, int64_t intRange, int coordsPerParam,
                               uint64_t seed, const std::function<bool(const std::string&)>& isOne) {
  Value* loss = nullptr;
  for (size_t i = 0; i < g.outputs().size(); ++i)
    if (g.outputName(i) == lossName) loss = g.outputs()[i].value;
  TPC_ASSERT(loss, "gradcheck: no output " + lossName);
  std::vector<Value*> params = g.params();
  auto grads = appendGradients(g, loss, params);
  TPC_ASSERT(grads.ok(), grads.ok() ? "" : grads.error());
  g.clearOutputs();
  g.addOutput(loss, "loss");
  for (Value* d : *grads) g.addOutput(d);
  CpuOptions opts;
  opts.fp64 = true;
  auto ex = CpuExecutor::create(g, opts);
  TPC_ASSERT(ex.ok(), ex.ok() ? "" : ex.error());

  std::mt19937_64 rng(seed);
  std::vector<HostTensor> in, ps;
  for (Value* v : g.inputs()) {
    HostTensor t(v->type());
    for (int64_t i = 0; i < t.numel(); ++i) t.setFromDouble(i, static_cast<double>(rng() % intRange));
    in.push_back(t);
  }
  std::normal_distribution<double> nd(0, 0.1);
  for (Value* v : params) {
    HostTensor t(TensorType(DType::f64, v->shape()));
    double base = isOne(v->name()) ? 1.0 : 0.0;
    for (int64_t i = 0; i < t.numel(); ++i) t.setFromDouble(i, base + nd(rng));
    ps.push_back(t);
  }
  auto ptrs = [](std::vector<HostTensor>& v) {
    std::vector<const HostTensor*> p;
    for (auto& t : v) p.push_back(&t);
    return p;
  };
  auto lossAt = [&]() {
    auto r = (*ex)->run(ptrs(in), ptrs(ps), 1);
    TPC_ASSERT(r.ok(), r.ok() ? "" : r.error());
    return (*r)[0].getAsDouble(0);
  };
  auto base = (*ex)->run(ptrs(in), ptrs(ps), 1);
  TPC_ASSERT(base.ok(), base.ok() ? "" : base.error());
  GradcheckResult res;
  const double h = 1e-6;
  for (size_t k = 0; k < params.size(); ++k) {
    for (int c = 0; c < coordsPerParam; ++c) {
      int64_t i = static_cast<int64_t>(rng() % static_cast<uint64_t>(ps[k].numel()));
      double x0 = ps[k].getAsDouble(i);
      ps[k].setFromDouble(i, x0 + h);
      double up = lossAt();
      ps[k].setFromDouble(i, x0 - h);
      double down = lossAt();
      ps[k].setFromDouble(i, x0);
      double numeric = (up - down) / (2 * h), a = (*base)[1 + k].getAsDouble(i);
      // A NaN gradient (either side) is the worst: `err >= worst` is false for NaN.
      double err = nanAsInfinite(std::abs(a - numeric) / std::max({std::abs(a), std::abs(numeric), 1e-3}));
      ++res.checked;
      if (err >= res.worstRelError) {
        res.worstRelError = err;
        std::ostringstream os;
        os << params[k]->name() << "[" << i << "]: analytic " << a << ", numeric " << numeric;
        res.worst = os.str();
      }
    }
  }
  return res;
}

}  // namespace tpc::test
