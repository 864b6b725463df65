// Backend: executes one rank's training-step graph. The state (parameters, optimizer moments) lives in the
// backend; a step reads the batch and scalars, and every output named like a parameter replaces it in
// place ("the runtime updates in place by giving each new value its old buffer", DESIGN.md).
#pragma once

#include <map>
#include <memory>
#include <string>

#include "ir/graph.h"
#include "ir/status.h"
#include "runtime/host_tensor.h"

namespace tpc {

using TensorMap = std::map<std::string, HostTensor>;

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;
  // Compiles `step` and takes `initialState` (one tensor per graph parameter, by name).
  virtual Status prepare(const Graph& step, const TensorMap& initialState) = 0;
  // Runs one step. `inputs`: every graph input by name. `stepIndex` keys the dropout RNG.
  // Returns the outputs that do not update a parameter (the loss, the grad norm, ...), by name.
  virtual Result<TensorMap> step(const TensorMap& inputs, int64_t stepIndex) = 0;
  // The current value of a parameter or optimizer-state tensor.
  virtual Result<HostTensor> readState(const std::string& name) const = 0;
  // Device memory this process holds on its accelerator, for the log line; -1 where that means nothing (CPU).
  virtual int64_t deviceMemoryInUse() const { return -1; }
  // Kernel launches (and library calls) per step; -1 where not counted.
  virtual int64_t launchesPerStep() const { return -1; }
};

}  // namespace tpc
