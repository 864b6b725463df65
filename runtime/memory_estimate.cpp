// estimateMemory: the live bytes of planStepMemory's buffers, node by node.
#include "runtime/memory_estimate.h"

#include <cstdio>
#include <vector>

#include "runtime/memory_plan.h"

namespace tpc {

MemoryEstimate estimateMemory(const Graph& g) {
  MemoryEstimate m;
  for (const Value* p : g.params()) m.stateBytes += p->type().bytes();
  for (const Value* v : g.inputs()) m.inputBytes += v->type().bytes();
  // The buffers and lifetimes of the CUDA backend's plan, without its views, fusion or workspaces; their
  // bytes summed node by node (no arena packing).
  StepMemoryPlan plan = planStepMemory(g, {}, nullptr, [](const Node&) { return false; });
  std::vector<Node*> nodes = g.nodeVector();
  std::vector<int64_t> startAt(nodes.size() + 1, 0), endAfter(nodes.size() + 1, 0);
  for (const PlannedBuffer& b : plan.buffers) {
    startAt[b.first] += b.bytes;
    endAfter[b.last] += b.bytes;
  }
  int64_t live = 0;
  for (size_t i = 0; i < nodes.size(); ++i) {
    live += startAt[i];
    if (live > m.peakActivationBytes) m.peakActivationBytes = live, m.peakAt = nodes[i];
    live -= endAfter[i];
  }
  return m;
}

std::string formatBytes(int64_t bytes) {
  char b[32];
  double v = static_cast<double>(bytes);
  if (v >= 1024.0 * 1024 * 1024) std::snprintf(b, sizeof b, "%.2f GiB", v / (1024.0 * 1024 * 1024));
  else if (v >= 1024.0 * 1024) std::snprintf(b, sizeof b, "%.1f MiB", v / (1024.0 * 1024));
  else std::snprintf(b, sizeof b, "%.1f KiB", v / 1024.0);
  return b;
}

}  // namespace tpc
