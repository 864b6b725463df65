// The static memory plan of one rank's step: every buffer with a lifetime [first, last] (inclusive node
// indices) gets an offset in one arena; buffers whose lifetimes overlap never share bytes. Greedy by size,
// largest first, each at the lowest offset that fits (a first-fit that packs transformer steps tightly).
#pragma once

#include <cstdint>
#include <vector>

namespace tpc::cuda {

struct PlannedBuffer {
  int64_t bytes = 0;
  int first = 0, last = 0;  // inclusive
  int64_t offset = -1;      // set by planMemory
};

// Sets every buffer's offset (aligned to `alignment`); returns the arena size (the planned peak).
int64_t planMemory(std::vector<PlannedBuffer>& buffers, int64_t alignment = 256);

}  // namespace tpc::cuda
