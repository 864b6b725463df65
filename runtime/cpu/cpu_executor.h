// The CPU reference interpreter: runs any Graph op by op with plain loops, in fp32 or (for gradient
// checks) fp64. Buffers are freed after their last use; matmuls and large elementwise ops use all cores.
#pragma once

#include <memory>
#include <vector>

#include "ir/graph.h"
#include "ir/status.h"
#include "runtime/backend.h"
#include "runtime/host_tensor.h"

namespace tpc {

namespace cpu {
class Communicator;
}

// Test-only faults: tests (and `tpc run` under TPC_TEST_FAULT, runtime/cpu/test_faults.h) inject them to
// check how a run fails. Normal runs leave them unset.
struct CpuFaults {
  int64_t step = -1;         // the step at which they strike (-1: never)
  std::string nanValue;      // element 0 of this value (named as printed: "%d.wte", "%57") becomes a NaN
  int64_t nanRank = -1;      // ... on this mesh rank alone (-1: on every rank)
  int64_t stallRank = -1;    // this mesh rank stops before its first collective and waits until the mesh aborts
};

// Values of dtype bf16/f16 are held as f32 (f64) rounded through their 16-bit type after every op that
// produces them, so a `cast` to bf16 and everything computed in bf16 see bf16-rounded values.
struct CpuOptions {
  bool fp64 = false;    // compute every float value in double (inputs/params/outputs are then f64 tensors)
  int threads = 0;      // 0: all hardware threads
  uint64_t seed = 1234; // dropout: Philox keyed by (seed, step, node key, global element index)
  // This rank's view of the other ranks, for collectives; null: a single rank (every mesh axis of size 1).
  std::shared_ptr<cpu::Communicator> communicator;
  CpuFaults faults;
  // The backends' prepare() refuses a step whose parameters, batch and peak activations (memory_estimate.h)
  // need more host memory than this many bytes; 0: what the machine has available (availableHostMemory; no
  // check under TPC_HOST_MEMORY_CHECK=0), -1: no check.
  int64_t hostMemoryLimit = 0;
};

class CpuExecutor {
 public:
  static Result<std::unique_ptr<CpuExecutor>> create(const Graph& g, CpuOptions options);
  virtual ~CpuExecutor() = default;
  // `g` must outlive the executor.
  // `inputs` match g.inputs() and `params` g.params(), in order; returns g.outputs() in order.
  // Float tensors are f32 (or f64 with CpuOptions::fp64); integer inputs keep their dtype.
  virtual Result<std::vector<HostTensor>> run(const std::vector<const HostTensor*>& inputs,
                                              const std::vector<const HostTensor*>& params, int64_t step) = 0;
  // Checking mode (Backend::findFirstNonFinite): while on, run() tests every input, parameter and produced
  // float value and keeps the first one, in execution order, holding a NaN or an infinity; the run itself
  // goes on unchanged (a mesh's ranks still meet at every collective). rank stays -1: the caller knows it.
  virtual void setFiniteCheck(bool on) = 0;
  virtual const std::optional<NonFiniteValue>& firstNonFinite() const = 0;
  // Bytes of value buffers alive at once, at most, during the last run (inputs and params included).
  virtual int64_t peakLiveBytes() const = 0;
};

}  // namespace tpc
