// fastestCandidate (runtime/cuda/candidate_timing.h) on the GPU, in both timing modes: candidates whose costs are
// known (device memsets of different sizes) are ranked by what they cost, a candidate that cannot run is never
// chosen, and the sustained mode runs every candidate for about its 40 ms in each of its three rounds.
#include <catch2/catch.hpp>

#include <vector>

#include "gpu_test_support.h"
#include "runtime/cuda/candidate_timing.h"

namespace tpc {
namespace {

using cuda::CandidateTiming;

struct MemsetCandidates {
  std::vector<size_t> bytes;  // candidate i sets bytes[i]; 0: cannot run
  void* buffer = nullptr;
  std::vector<long> runs;

  explicit MemsetCandidates(std::vector<size_t> b) : bytes(std::move(b)), runs(bytes.size(), 0) {
    size_t most = 0;
    for (size_t n : bytes) most = std::max(most, n);
    CUDA_OK(cudaMalloc(&buffer, most));
  }
  ~MemsetCandidates() { cudaFree(buffer); }
  bool run(size_t i) {
    if (bytes[i] == 0) return false;
    ++runs[i];
    return cudaMemsetAsync(buffer, static_cast<int>(runs[i] & 0xff), bytes[i], nullptr) == cudaSuccess;
  }
};

TEST_CASE("candidate timing: both modes pick the cheapest of memsets of known sizes, never one that cannot run, and "
          "the sustained mode times each for its rounds", "[gpu][autotune]") {
  test::requireGpuOrSkip();
  const size_t MiB = size_t{1} << 20;
  for (CandidateTiming timing : {CandidateTiming::Quick, CandidateTiming::Sustained}) {
    INFO((timing == CandidateTiming::Quick ? "quick" : "sustained"));
    // 512, 0 (cannot run), 32, 256 MiB: the cheapest is index 2, 8-16x under the others.
    MemsetCandidates c({512 * MiB, 0, 32 * MiB, 256 * MiB});
    const size_t best = cuda::fastestCandidate(c.bytes.size(), [&](size_t i) { return c.run(i); }, timing);
    CHECK(best == 2);
    CHECK(c.runs[1] == 0);
    if (timing == CandidateTiming::Quick) {
      for (size_t i : {size_t{0}, size_t{2}, size_t{3}}) CHECK(c.runs[i] == 1 + 5);  // one to warm up, 5 timed
    } else {
      // A 32 MiB memset takes under 0.05 ms at any HBM's rate, so its three 40 ms rounds alone are hundreds of
      // runs; a 512 MiB one (under 0.5 ms) at least 80 over the rounds.
      CHECK(c.runs[2] > 3 * 40 / 0.05);
      CHECK(c.runs[0] >= 3 * 40 / 0.5);
      // Each ran for about the same time at its own rate (candidate 0, the first that runs, also heats the GPU).
      CHECK(c.runs[2] > 4 * c.runs[3]);
    }
  }
  // Nothing can run: index 0, and nothing ran.
  MemsetCandidates none({0, 0});
  CHECK(cuda::fastestCandidate(2, [&](size_t i) { return none.run(i); }, CandidateTiming::Sustained) == 0);
  CHECK(none.runs == std::vector<long>{0, 0});
}

}  // namespace
}  // namespace tpc
