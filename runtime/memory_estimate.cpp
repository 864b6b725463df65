#include "runtime/memory_estimate.h"

#include <cstdio>
#include <map>
#include <set>
#include <vector>

namespace tpc {

MemoryEstimate estimateMemory(const Graph& g) {
  MemoryEstimate m;
  for (const Value* p : g.params()) m.stateBytes += p->type().bytes();
  for (const Value* v : g.inputs()) m.inputBytes += v->type().bytes();
  std::vector<const Node*> order;
  std::map<const Value*, size_t> lastUse;
  for (const Node* n : g.nodes()) {
    for (const Value* o : n->operands()) lastUse[o] = order.size();
    order.push_back(n);
  }
  for (const auto& o : g.outputs()) lastUse[o.value] = order.size();  // outputs live to the end
  // Outputs named like a parameter are written into its buffer (the runtime updates state in place).
  std::set<std::string> paramNames;
  for (const Value* p : g.params()) paramNames.insert(p->name());
  std::set<const Value*> inPlace;
  for (size_t i = 0; i < g.outputs().size(); ++i)
    if (paramNames.count(g.outputName(i))) inPlace.insert(g.outputs()[i].value);
  // Bytes freed after each node, then a sweep.
  std::vector<int64_t> freedAfter(order.size() + 1, 0);
  int64_t live = 0;
  for (size_t i = 0; i < order.size(); ++i) {
    for (const Value* r : order[i]->results()) {
      int64_t b = inPlace.count(r) ? 0 : r->type().bytes();
      live += b;
      auto it = lastUse.find(r);
      freedAfter[it == lastUse.end() ? i : it->second] += b;  // an unread result dies at once
    }
    if (live > m.peakActivationBytes) m.peakActivationBytes = live, m.peakAt = order[i];
    live -= freedAfter[i];
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
