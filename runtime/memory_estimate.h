// The memory a step graph needs when every value lives from the node that makes it to its last reader
// (how both backends free buffers; the lifetimes of runtime/memory_plan.h): parameters and optimizer state
// (persistent; their new values are written in place where that is safe), inputs, and the peak of the
// activations alive at once. `tpc dump --memory` prints it for a config, before anything runs.
#pragma once

#include <cstdint>
#include <string>

#include "ir/graph.h"

namespace tpc {

struct MemoryEstimate {
  int64_t stateBytes = 0;       // graph params: parameters and AdamW moments
  int64_t inputBytes = 0;       // graph inputs: the batch, lr, step
  int64_t peakActivationBytes = 0;
  const Node* peakAt = nullptr;  // the node during which the activations peak
  int64_t total() const { return stateBytes + inputBytes + peakActivationBytes; }
};

MemoryEstimate estimateMemory(const Graph& g);
// "1.5 GiB", "312.0 MiB", "4.0 KiB".
std::string formatBytes(int64_t bytes);

}  // namespace tpc
