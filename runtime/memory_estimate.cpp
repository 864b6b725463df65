// estimateMemory: the live bytes of planStepMemory's buffers, node by node.
#include "runtime/memory_estimate.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

#include "runtime/memory_plan.h"

namespace tpc {

MemoryEstimate estimateMemory(const Graph& g, int floatBytes) {
  auto bytesOf = [floatBytes](const Value* v) {
    return floatBytes > 0 && isFloat(v->dtype()) ? v->type().numel() * floatBytes : v->type().bytes();
  };
  MemoryEstimate m;
  for (const Value* p : g.params()) m.stateBytes += bytesOf(p);
  for (const Value* v : g.inputs()) m.inputBytes += bytesOf(v);
  // The buffers and lifetimes of the CUDA backend's plan, without its views, fusion or workspaces; their
  // bytes summed node by node (no arena packing).
  StepMemoryPlan plan = planStepMemory(g, {}, nullptr, [](const Node&) { return false; });
  std::vector<int64_t> bytes;
  for (const PlannedBuffer& b : plan.buffers) bytes.push_back(b.bytes);
  for (const auto& [v, b] : plan.bufferOf) bytes[static_cast<size_t>(b)] = bytesOf(v);
  std::vector<Node*> nodes = g.nodeVector();
  std::vector<int64_t> startAt(nodes.size() + 1, 0), endAfter(nodes.size() + 1, 0);
  for (size_t k = 0; k < plan.buffers.size(); ++k) {
    startAt[plan.buffers[k].first] += bytes[k];
    endAfter[plan.buffers[k].last] += bytes[k];
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

int64_t availableHostMemory() {
  int64_t avail = -1;
  std::ifstream meminfo("/proc/meminfo");
  for (std::string key; meminfo >> key;) {
    int64_t kib = 0;
    meminfo >> kib;
    if (key == "MemAvailable:") {
      avail = kib * 1024;
      break;
    }
    meminfo.ignore(std::numeric_limits<std::streamsize>::max(), '\n');
  }
  // A container's limit (cgroup v2): for the folder this process is in and each one above it that sets
  // memory.max, what is left of it, the page cache the kernel can reclaim (memory.stat's inactive_file)
  // counted as free as MemAvailable counts it.
  auto number = [](const std::string& text, int64_t& out) {
    char* end = nullptr;
    errno = 0;
    long long v = std::strtoll(text.c_str(), &end, 10);
    if (errno || end == text.c_str() || *end) return false;
    out = v;
    return true;
  };
  std::ifstream self("/proc/self/cgroup");
  for (std::string line; std::getline(self, line);) {
    if (line.rfind("0::", 0) != 0) continue;
    for (std::filesystem::path dir = "/sys/fs/cgroup" + line.substr(3);; dir = dir.parent_path()) {
      std::string maxText, currentText;
      int64_t max = 0, current = 0, reclaimable = 0;
      if ((std::ifstream(dir / "memory.max") >> maxText) && number(maxText, max) &&
          (std::ifstream(dir / "memory.current") >> currentText) && number(currentText, current)) {
        std::ifstream stat(dir / "memory.stat");
        for (std::string key, value; stat >> key >> value;)
          if (key == "inactive_file" && number(value, reclaimable)) break;
        int64_t left = std::max<int64_t>(0, max - std::max<int64_t>(0, current - reclaimable));
        avail = avail < 0 ? left : std::min(avail, left);
      }
      if (dir == "/sys/fs/cgroup" || !dir.has_parent_path() || dir.parent_path() == dir) break;
    }
    break;
  }
  return avail;
}

int64_t hostMemoryLimit(int64_t option) {
  if (option) return option;
  const char* check = std::getenv("TPC_HOST_MEMORY_CHECK");
  return check && std::string(check) == "0" ? -1 : availableHostMemory();
}

Status checkHostMemory(const MemoryEstimate& need, int64_t available, const std::string& who, int64_t ranks) {
  if (available < 0 || need.total() <= available) return {};
  std::string peak;
  if (need.peakAt && need.peakAt->numResults())
    peak = cat(" at their peak, during ", need.peakAt->opName(), " -> ", need.peakAt->result(0)->ref());
  return makeError(who, ": one training step needs about ", formatBytes(need.total()), " of host memory",
                   ranks > 1 ? cat(" for the ", ranks, " ranks of this process") : std::string(), " (parameters and optimizer state ",
                   formatBytes(need.stateBytes), ", the batch ", formatBytes(need.inputBytes), ", activations ",
                   formatBytes(need.peakActivationBytes), peak, "), but this machine has ", formatBytes(available),
                   " available: lower --micro-batch-size or --seq-length, add --recompute full, ",
                   ranks > 1 ? "give fewer ranks (--tp, --dp) or a process each (mpirun -np N), " : "",
                   "or run on a GPU (--backend cuda) (TPC_HOST_MEMORY_CHECK=0 skips this check)");
}

}  // namespace tpc
