// planMemory: largest first, lowest fitting offset among the already placed buffers that overlap in time.
#include "runtime/cuda/memory_plan.h"

#include <algorithm>
#include <numeric>

namespace tpc::cuda {

int64_t planMemory(std::vector<PlannedBuffer>& buffers, int64_t alignment) {
  std::vector<size_t> order(buffers.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return buffers[a].bytes > buffers[b].bytes; });
  auto align = [&](int64_t v) { return (v + alignment - 1) / alignment * alignment; };
  std::vector<size_t> placed;
  int64_t peak = 0;
  std::vector<std::pair<int64_t, int64_t>> busy;  // [begin, end) of overlapping placed buffers
  for (size_t i : order) {
    PlannedBuffer& b = buffers[i];
    int64_t size = align(std::max<int64_t>(b.bytes, 1));
    busy.clear();
    for (size_t j : placed) {
      const PlannedBuffer& o = buffers[j];
      if (o.first <= b.last && b.first <= o.last) busy.push_back({o.offset, o.offset + align(std::max<int64_t>(o.bytes, 1))});
    }
    std::sort(busy.begin(), busy.end());
    int64_t at = 0;
    for (auto [s, e] : busy) {
      if (at + size <= s) break;
      at = std::max(at, e);
    }
    b.offset = at;
    peak = std::max(peak, at + size);
    placed.push_back(i);
  }
  return peak;
}

}  // namespace tpc::cuda
