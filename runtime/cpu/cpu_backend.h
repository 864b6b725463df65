// The CPU reference Backend: keeps the state (parameters, optimizer moments) as host tensors and runs a
// step with the CpuExecutor; outputs named like a parameter replace it, unless the step is non-finite.
#pragma once

#include <memory>

#include "runtime/backend.h"
#include "runtime/cpu/cpu_executor.h"

namespace tpc {

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(CpuOptions options) : options_(std::move(options)) {}
  std::string name() const override { return options_.fp64 ? "cpu-fp64" : "cpu"; }
  Status prepare(const Graph& step, const TensorMap& initialState) override;
  Result<TensorMap> step(const TensorMap& inputs, int64_t stepIndex) override;
  Result<std::optional<NonFiniteValue>> findFirstNonFinite(const TensorMap& inputs, int64_t stepIndex) override;
  Result<HostTensor> readState(const std::string& name) const override;
  Status writeState(const std::string& name, const HostTensor& value) override;

 private:
  // Runs the step and returns every output, committing nothing.
  Result<std::vector<HostTensor>> run(const TensorMap& inputs, int64_t stepIndex);

  CpuOptions options_;
  std::unique_ptr<Graph> graph_;  // our own copy: the executor refers to its nodes
  std::unique_ptr<CpuExecutor> exec_;
  TensorMap state_;
};

std::unique_ptr<Backend> createCpuBackend(CpuOptions options);

}  // namespace tpc
