// The CUDA backend's memory plan: runtime/memory_plan.h with the CUDA lowering's views (nodeExec View)
// aliasing their operand's buffer.
#pragma once

#include "runtime/memory_plan.h"

namespace tpc::cuda {

using tpc::PlannedBuffer;
using tpc::planMemory;
using tpc::StepMemoryPlan;

StepMemoryPlan planStepMemory(const Graph& g, llvm::ArrayRef<int64_t> workspaceBytes,
                              const llvm::DenseMap<const Node*, const FusionGroup*>* groupOf = nullptr,
                              int64_t alignment = 256, llvm::function_ref<bool(const Node&)> onCommStream = {},
                              llvm::function_ref<bool(const Value*)> external = {});

}  // namespace tpc::cuda
