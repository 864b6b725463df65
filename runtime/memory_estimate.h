// The memory a step graph needs when every value lives from the node that makes it to its last reader
// (how both backends free buffers; the lifetimes of runtime/memory_plan.h): parameters and optimizer state
// (persistent; their new values are written in place where that is safe), inputs, and the peak of the
// activations alive at once. `tpc dump --memory` prints it for a config, before anything runs.
#pragma once

#include <cstdint>
#include <string>

#include "ir/graph.h"
#include "ir/status.h"

namespace tpc {

struct MemoryEstimate {
  int64_t stateBytes = 0;       // graph params: parameters and AdamW moments
  int64_t inputBytes = 0;       // graph inputs: the batch, lr, step
  int64_t peakActivationBytes = 0;
  const Node* peakAt = nullptr;  // the node during which the activations peak
  int64_t total() const { return stateBytes + inputBytes + peakActivationBytes; }
  // Another rank's estimate added (its peak counted as if at the same time; peakAt stays the first one's).
  MemoryEstimate& operator+=(const MemoryEstimate& o) {
    stateBytes += o.stateBytes, inputBytes += o.inputBytes, peakActivationBytes += o.peakActivationBytes;
    if (!peakAt) peakAt = o.peakAt;
    return *this;
  }
};

// floatBytes > 0: float values counted at that element size (the CPU backend computes every float value in
// f32, or f64), integers at their own.
MemoryEstimate estimateMemory(const Graph& g, int floatBytes = 0);
// "1.5 GiB", "312.0 MiB", "4.0 KiB".
std::string formatBytes(int64_t bytes);

// The host memory this process can still take: /proc/meminfo's MemAvailable, or less where a cgroup (v2)
// limits the memory of the container it runs in; -1 where neither can be read.
int64_t availableHostMemory();
// The limit the CPU backends check against: `option` (CpuOptions::hostMemoryLimit) where nonzero; else -1 (no
// check) under TPC_HOST_MEMORY_CHECK=0, else availableHostMemory().
int64_t hostMemoryLimit(int64_t option);

// The CPU backends' check before a step's buffers are allocated: an error when `need` (summed over the
// ranks this process runs) is more than `available` bytes (< 0: unknown, no check), naming the parts and
// what to change; `who` begins the message ("cpu backend").
Status checkHostMemory(const MemoryEstimate& need, int64_t available, const std::string& who, int64_t ranks = 1);

}  // namespace tpc
