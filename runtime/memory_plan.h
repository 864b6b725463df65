// The static memory plan of one rank's step (the CUDA backend's arena; `tpc dump --memory` sums its
// lifetimes). planMemory: every buffer with a lifetime [first, last] (inclusive node indices) gets an offset
// in one arena; buffers whose lifetimes overlap never share bytes. Greedy by size, largest first, each at the
// lowest offset that fits (a first-fit that packs transformer steps tightly). planStepMemory: the buffers of
// a graph's values, the views that alias them, results written over a dead operand and the outputs written
// into their parameter's buffer.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "ir/fusion_group.h"
#include "ir/graph.h"
#include "llvm/ADT/ArrayRef.h"
#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/STLFunctionalExtras.h"

namespace tpc {

struct PlannedBuffer {
  int64_t bytes = 0;
  int first = 0, last = 0;  // inclusive
  int64_t offset = -1;      // set by planMemory
};

// Sets every buffer's offset (aligned to `alignment`); returns the arena size (the planned peak).
int64_t planMemory(std::vector<PlannedBuffer>& buffers, int64_t alignment = 256);

struct StepMemoryPlan {
  std::vector<PlannedBuffer> buffers;  // offsets set: node results, workspaces
  llvm::DenseMap<const Value*, int> bufferOf;  // node results that own an arena buffer
  std::vector<int> workspaceOf;                // per node (graph order): its workspace buffer, or -1
  // View results (nodes `isView` says are views) and results written over a dead operand (OpInfo::inPlaceResult:
  // dlogits over the logits): the value whose memory they are, never itself one of them: a node result with an
  // arena buffer (kept alive to their last use), an in-place output, a parameter or an input.
  llvm::DenseMap<const Value*, const Value*> viewOf;
  // Outputs named like a parameter that are written straight into its buffer: an elementwise-like node
  // (optimizer, elementwise) that no later node reads the old parameter after, directly or through a view.
  llvm::DenseMap<const Value*, std::string> inPlace;
  std::vector<std::pair<const Value*, std::string>> paramCopies;  // the other ones: copied at the step's end
  int64_t arenaBytes = 0;
};

// `workspaceBytes[k]`: the scratch node k (graph order) needs for the step. `groupOf`: the fusion group of
// each member node (ir/fusion_group.h): a group's members all run at its last member, and a value read only
// inside its group gets no buffer. `isView(n)`: n's result is its operand 0's memory (the backend decides:
// the CUDA backend's views, none on the CPU). `onCommStream(n)` (if given): n runs on another stream until
// the first later node that reads its result (or the step's end when none does), so the arena buffers of
// its operands, results and workspace stay live until that node (comm_stream_schedule.h joins there).
// `external(v)` (if given): node results the backend keeps outside the arena (the CUDA backend's 16-bit
// parameter copies, which live from one step to the next); they get no buffer and nothing is written over them.
StepMemoryPlan planStepMemory(const Graph& g, llvm::ArrayRef<int64_t> workspaceBytes,
                              const llvm::DenseMap<const Node*, const FusionGroup*>* groupOf,
                              llvm::function_ref<bool(const Node&)> isView, int64_t alignment = 256,
                              llvm::function_ref<bool(const Node&)> onCommStream = {},
                              llvm::function_ref<bool(const Value*)> external = {});

}  // namespace tpc
