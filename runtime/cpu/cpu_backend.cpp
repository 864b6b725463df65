// CpuBackend: the state map plus the executor.
#include "runtime/cpu/cpu_backend.h"

#include <cstring>

#include "runtime/memory_estimate.h"

namespace tpc {

Status CpuBackend::prepare(const Graph& step, const TensorMap& initialState) {
  graph_ = step.clone();
  state_.clear();
  exec_.reset();
  DType floatType = options_.fp64 ? DType::f64 : DType::f32;
  const int64_t limit = hostMemoryLimit(options_.hostMemoryLimit);
  TPC_TRY(checkHostMemory(estimateMemory(*graph_, static_cast<int>(dtypeSize(floatType))), limit, "cpu backend"));
  for (Value* p : graph_->params()) {
    auto it = initialState.find(p->name());
    if (it == initialState.end())
      return makeError("cpu backend: no initial value for parameter %", p->name(), " of graph @", graph_->name());
    if (it->second.shape() != p->shape())
      return makeError("cpu backend: parameter %", p->name(), " must be ", p->type().str(), ", got ", it->second.type().str());
    state_[p->name()] = isFloat(p->dtype()) ? it->second.convertTo(floatType) : it->second.clone();
  }
  TPC_ASSIGN(exec_, CpuExecutor::create(*graph_, options_));
  return {};
}

Result<std::vector<HostTensor>> CpuBackend::run(const TensorMap& inputs, int64_t stepIndex) {
  if (!exec_) return makeError("cpu backend: step() before prepare()");
  std::vector<const HostTensor*> in, params;
  std::vector<HostTensor> converted;
  converted.reserve(graph_->inputs().size());
  DType floatType = options_.fp64 ? DType::f64 : DType::f32;
  for (Value* v : graph_->inputs()) {
    auto it = inputs.find(v->name());
    if (it == inputs.end()) return makeError("cpu backend: missing input %", v->name(), " (", v->type().str(), ")");
    if (isFloat(it->second.dtype()) && it->second.dtype() != floatType) {
      converted.push_back(it->second.convertTo(floatType));
      in.push_back(&converted.back());
    } else {
      in.push_back(&it->second);
    }
  }
  for (Value* p : graph_->params()) params.push_back(&state_.at(p->name()));
  return exec_->run(in, params, stepIndex);
}

Result<TensorMap> CpuBackend::step(const TensorMap& inputs, int64_t stepIndex) {
  TPC_ASSIGN(std::vector<HostTensor> outs, run(inputs, stepIndex));
  TensorMap result;
  std::vector<size_t> updates;
  for (size_t i = 0; i < outs.size(); ++i) {
    std::string name = graph_->outputName(i);
    if (state_.count(name)) updates.push_back(i);
    else result[name] = std::move(outs[i]);
  }
  // A non-finite step leaves the state as it was (backend.h).
  if (isNonFiniteStep(result)) return result;
  for (size_t i : updates) state_[graph_->outputName(i)] = std::move(outs[i]);
  return result;
}

Result<std::optional<NonFiniteValue>> CpuBackend::findFirstNonFinite(const TensorMap& inputs, int64_t stepIndex) {
  if (!exec_) return makeError("cpu backend: findFirstNonFinite() before prepare()");
  exec_->setFiniteCheck(true);
  auto outs = run(inputs, stepIndex);
  exec_->setFiniteCheck(false);
  if (!outs.ok()) return Error{outs.error()};
  return exec_->firstNonFinite();
}

Result<HostTensor> CpuBackend::readState(const std::string& name) const {
  auto it = state_.find(name);
  if (it == state_.end()) return makeError("cpu backend: no state tensor named '", name, "'");
  return it->second;
}

Status CpuBackend::writeState(const std::string& name, const HostTensor& value) {
  auto it = state_.find(name);
  if (it == state_.end()) return makeError("cpu backend: no state tensor named '", name, "'");
  HostTensor& t = it->second;
  if (value.numel() != t.numel())
    return makeError("cpu backend: state tensor '", name, "' is ", t.type().str(), ", cannot take ", value.type().str());
  // Same elements, maybe another shape of them (tp views QKV as [D, 3, D]): keep ours. A new buffer, as
  // readState hands out tensors that share the old one.
  HostTensor converted = value.dtype() == t.dtype() ? value : value.convertTo(t.dtype());
  HostTensor fresh(t.type());
  std::memcpy(fresh.raw(), converted.raw(), fresh.bytes());
  t = std::move(fresh);
  return {};
}

std::unique_ptr<Backend> createCpuBackend(CpuOptions options) { return std::make_unique<CpuBackend>(std::move(options)); }

}  // namespace tpc
