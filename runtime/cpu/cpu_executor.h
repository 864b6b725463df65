// The CPU reference interpreter: runs any Graph op by op with plain loops, in fp32 or (for gradient
// checks) fp64. Buffers are freed after their last use; matmuls and large elementwise ops use all cores.
#pragma once

#include <memory>
#include <vector>

#include "ir/graph.h"
#include "ir/status.h"
#include "runtime/host_tensor.h"

namespace tpc {

struct CpuOptions {
  bool fp64 = false;    // compute every float value in double (inputs/params/outputs are then f64 tensors)
  int threads = 0;      // 0: all hardware threads
  uint64_t seed = 1234; // dropout: Philox keyed by (seed, step, node key, global element index)
};

class CpuExecutor {
 public:
  static Result<std::unique_ptr<CpuExecutor>> create(const Graph& g, CpuOptions options);
  virtual ~CpuExecutor() = default;
  // `inputs` match g.inputs() and `params` g.params(), in order; returns g.outputs() in order.
  // Float tensors are f32 (or f64 with CpuOptions::fp64); integer inputs keep their dtype.
  virtual Result<std::vector<HostTensor>> run(const std::vector<const HostTensor*>& inputs,
                                              const std::vector<const HostTensor*>& params, int64_t step) = 0;
};

}  // namespace tpc
