// planStepMemory with the views of the CUDA lowering (memory_plan.h).
#include "runtime/cuda/memory_plan.h"

#include "runtime/cuda/lowering.h"

namespace tpc::cuda {

StepMemoryPlan planStepMemory(const Graph& g, llvm::ArrayRef<int64_t> workspaceBytes,
                              const llvm::DenseMap<const Node*, const FusionGroup*>* groupOf, int64_t alignment,
                              llvm::function_ref<bool(const Node&)> onCommStream, llvm::function_ref<bool(const Value*)> external) {
  return tpc::planStepMemory(g, workspaceBytes, groupOf, [](const Node& n) { return nodeExec(n) == NodeExec::View; },
                             alignment, onCommStream, external);
}

}  // namespace tpc::cuda
