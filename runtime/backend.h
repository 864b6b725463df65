// Backend: executes one rank's training-step graph. The state (parameters, optimizer moments) lives in the
// backend; a step reads the batch and scalars, and every output named like a parameter replaces it in
// place ("the runtime updates in place by giving each new value its old buffer", DESIGN.md).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "ir/graph.h"
#include "ir/status.h"
#include "runtime/host_tensor.h"

namespace tpc {

using TensorMap = std::map<std::string, HostTensor>;

// The first value of a step, in execution order, holding a NaN or an infinity (Backend::findFirstNonFinite).
struct NonFiniteValue {
  std::string value;    // as the IR printer names it: "%d.wte", "%57"
  std::string node;     // the producing node as printed ("%57 = matmul(...) : f32[..]"); "input" or "param"
  int64_t index = -1;   // the node's position in execution order (-1: an input or parameter)
  int64_t numNodes = 0; // nodes in the step
  int64_t rank = -1;    // the mesh rank that produced it (-1: a single-rank backend)
  int64_t element = 0;  // flat index of its first non-finite element
  double sample = 0;    // that element: nan, inf or -inf
  std::string describe() const;  // "%57 = matmul(...) : f32[8,64] (node 9 of 120) on rank 1: nan at element 3"
};

// The names of the scalar outputs a step is judged by: a step is non-finite when either is a NaN or an
// infinity (a graph without grad_norm is judged by its loss alone).
inline constexpr const char* kLossOutput = "loss";
inline constexpr const char* kGradNormOutput = "grad_norm";

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;
  // Compiles `step` and takes `initialState` (one tensor per graph parameter, by name).
  virtual Status prepare(const Graph& step, const TensorMap& initialState) = 0;
  // Runs one step. `inputs`: every graph input by name. `stepIndex` keys the dropout RNG.
  // Returns the outputs that do not update a parameter (the loss, the grad norm, ...), by name.
  //
  // Non-finite steps (tpc run --on-nan): when the returned "loss" or "grad_norm" is not finite, the step
  // must leave the state (parameters and optimizer moments) exactly as it was before it, bit for bit, and
  // still return its outputs. The trainer relies on this both to skip the step (--on-nan skip) and to
  // re-run it with findFirstNonFinite (--on-nan stop). The CPU backends compute the new state aside and
  // do not commit it; a backend that updates in place must gate the update on the device (as Megatron
  // and apex gate on found_inf) or keep what it overwrites. Every rank of a mesh decides alike (both
  // outputs are replicated), so ranks never diverge.
  virtual Result<TensorMap> step(const TensorMap& inputs, int64_t stepIndex) = 0;
  // step() in two halves, so that the host can read the next batch while the device runs this step:
  // startStep() may return once the step is under way (it has taken what it needs from `inputs`), and
  // finishStep() waits for it and returns what step() returns. Each startStep() is followed by one
  // finishStep() before the next. The default runs the whole step in startStep().
  virtual Status startStep(const TensorMap& inputs, int64_t stepIndex);
  virtual Result<TensorMap> finishStep();
  // Where the backend times its steps (the CUDA backend): the last finished step's time on the device and
  // the host's time in startStep() and in finishStep() (waiting for the device, then reading the outputs).
  struct StepTiming {
    double deviceMs = -1;
    double startMs = 0, waitMs = 0, readMs = 0;
  };
  virtual std::optional<StepTiming> lastStepTiming() const { return std::nullopt; }
  // Re-runs a step from the current state (the state a non-finite step left unchanged; same inputs and
  // stepIndex, so dropout draws the same masks) in a checking mode that tests every value the step reads
  // or produces, and returns the first one in execution order (over all ranks: the earliest position,
  // then the lowest rank) that holds a NaN or an infinity; nullopt when every value is finite. It must
  // not change the state. A backend that cannot check values returns an error saying so (the default).
  virtual Result<std::optional<NonFiniteValue>> findFirstNonFinite(const TensorMap& inputs, int64_t stepIndex);
  // The current value of a parameter or optimizer-state tensor.
  virtual Result<HostTensor> readState(const std::string& name) const = 0;
  // Replaces a state tensor with `value` (unsharded, as readState gives it; same element count, converted to
  // the backend's dtype). A backend that cannot returns an error saying so (the default).
  virtual Status writeState(const std::string& name, const HostTensor& value);
  // Replaces state tensor `name` with `source`'s current value of the same name: the evaluator's way to take
  // the training backend's parameters. The default goes through the host (source.readState, writeState); a
  // device backend copies device to device, rank by rank, where the source holds each of its ranks' blocks
  // on the same device in the same layout (deviceState).
  virtual Status copyStateFrom(const Backend& source, const std::string& name);
  // Where mesh rank `meshRank`'s block of a state tensor lives in one device buffer of this process (an
  // accelerator backend; rank 0 of an unsharded one holds the tensor whole), for copyStateFrom; nullopt where
  // it does not (host memory, or a rank of another process). `layout` says which block it is: the mesh and
  // the tensor's placement on it ("" unsharded), so that only blocks of the same sharding are copied.
  struct DeviceTensor {
    int device = -1;
    const void* data = nullptr;
    TensorType type;
    std::string layout;
  };
  virtual std::optional<DeviceTensor> deviceState(const std::string& /*name*/, int64_t /*meshRank*/ = 0) const {
    return std::nullopt;
  }
  // Device memory this process holds on its accelerator, for the log line; -1 where that means nothing (CPU).
  virtual int64_t deviceMemoryInUse() const { return -1; }
  // Kernel launches (and library calls) per step; -1 where not counted.
  virtual int64_t launchesPerStep() const { return -1; }
  // The GPUs the whole run computes on (every process of an mpirun job; virtual ranks share one): what MFU
  // divides the peak by. 0 for a backend without GPUs.
  virtual int64_t gpusInRun() const { return 0; }
  // The GPU's name as its driver reports it (cudaDeviceProp::name), for the MFU's peak; "" without one.
  virtual std::string gpuName() const { return ""; }

 private:
  std::optional<Result<TensorMap>> pending_;  // the default startStep()'s outputs, for finishStep()
};

// Whether a step's outputs (from Backend::step) mark it non-finite: its loss or grad_norm is a NaN or an
// infinity. Outputs missing from `outputs` do not count.
bool isNonFiniteStep(const TensorMap& outputs);

}  // namespace tpc
