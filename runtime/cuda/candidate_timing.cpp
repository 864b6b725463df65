// Timing a library's candidates (candidate_timing.h).
#include "runtime/cuda/candidate_timing.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>

namespace tpc::cuda {
namespace {

// Quick: runs per candidate, one to warm up (and to see it runs at all), then the timed ones.
constexpr int kTimedRuns = 5;
// Sustained: the GPU heated this long before the rounds; each candidate settled (untimed) this long, then timed
// this long, in this many rounds (a power cap's clock settles within a few ms of a change in the draw).
constexpr float kHeatMs = 300, kSettleMs = 5, kRoundMs = 40;
constexpr int kRounds = 3;
// Sustained scratch: the pattern uploaded once a buffer, then repeated on the device.
constexpr size_t kPatternBytes = size_t{1} << 20;

// Milliseconds between two events recorded around `runs` calls of run(i); negative when a run fails.
float timeRuns(size_t i, int runs, const std::function<bool(size_t)>& run, cudaEvent_t start, cudaEvent_t stop) {
  cudaEventRecord(start, nullptr);
  bool ran = true;
  for (int k = 0; k < runs && ran; ++k) ran = run(i);
  cudaEventRecord(stop, nullptr);
  float ms = 0;
  if (!ran || cudaEventSynchronize(stop) != cudaSuccess || cudaEventElapsedTime(&ms, start, stop) != cudaSuccess) return -1;
  return ms;
}

// Runs that last about `ms` at `perRunMs` a run, at least `least`.
int runsFor(float ms, float perRunMs, int least) {
  float n = ms / std::max(perRunMs, 1e-4f);
  return static_cast<int>(std::clamp(n, static_cast<float>(least), 1e5f));
}

// The sustained ranking (candidate_timing.h): per-run ms per candidate, the median of kRounds rounds; negative
// for candidates that cannot run.
std::vector<float> sustainedTimes(size_t count, const std::function<bool(size_t)>& run, cudaEvent_t start, cudaEvent_t stop) {
  std::vector<float> estimate(count, -1);
  size_t first = count;
  for (size_t i = 0; i < count; ++i) {
    if (!run(i)) continue;
    float ms = timeRuns(i, 3, run, start, stop);
    if (ms < 0) continue;
    estimate[i] = ms / 3;
    if (first == count) first = i;
  }
  std::vector<float> perRun(count, -1);
  if (first == count) return perRun;
  timeRuns(first, runsFor(kHeatMs, estimate[first], 1), run, start, stop);
  std::vector<std::vector<float>> rounds(count);
  for (int r = 0; r < kRounds; ++r)
    for (size_t i : candidateOrder(count, r)) {
      if (estimate[i] < 0) continue;
      timeRuns(i, runsFor(kSettleMs, estimate[i], 1), run, start, stop);
      const int runs = runsFor(kRoundMs, estimate[i], 3);
      float ms = timeRuns(i, runs, run, start, stop);
      if (ms >= 0) rounds[i].push_back(ms / static_cast<float>(runs));
    }
  for (size_t i = 0; i < count; ++i)
    if (rounds[i].size() == kRounds) perRun[i] = medianTime(rounds[i]);
  return perRun;
}

}  // namespace

Result<CandidateTiming> candidateTimingFromEnv() {
  const char* e = std::getenv("TPC_AUTOTUNE_SUSTAINED");
  if (!e || !*e || std::string(e) == "0") return CandidateTiming::Quick;
  if (std::string(e) == "1") return CandidateTiming::Sustained;
  return makeError("TPC_AUTOTUNE_SUSTAINED must be 0 or 1, got '", e, "'");
}

std::string candidateTimingKey(CandidateTiming t) { return t == CandidateTiming::Sustained ? " | sustained" : ""; }

std::vector<size_t> candidateOrder(size_t count, int round) {
  std::vector<size_t> order;
  for (size_t j = 0; j < count; ++j) order.push_back(j);
  if (round % 3 == 1) std::reverse(order.begin(), order.end());
  if (round % 3 == 2) std::stable_partition(order.begin(), order.end(), [](size_t i) { return i % 2 == 0; });
  return order;
}

float medianTime(std::vector<float> times) {
  if (times.empty()) return -1;
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

size_t fastestIndex(const std::vector<float>& times) {
  size_t best = 0;
  for (size_t i = 0; i < times.size(); ++i)
    if (times[i] >= 0 && (times[best] < 0 || times[i] < times[best])) best = i;
  return best;
}

DeviceScratch::~DeviceScratch() {
  for (void* p : ptrs_) cudaFree(p);
}

void* DeviceScratch::get(size_t bytes) {
  if (bytes == 0) return nullptr;
  void* p = nullptr;
  if (cudaMalloc(&p, bytes) != cudaSuccess) {
    cudaGetLastError();  // clear the error state of a failed allocation
    ok_ = false;
    return nullptr;
  }
  ptrs_.push_back(p);
  if (timing_ == CandidateTiming::Quick) {
    cudaMemset(p, 0x3c, bytes);
    return p;
  }
  std::vector<uint16_t> words((std::min(bytes, kPatternBytes) + 1) / 2);
  uint32_t x = 0x9e3779b9u ^ static_cast<uint32_t>(ptrs_.size() * 0x85ebca6bu);  // another pattern each buffer
  for (uint16_t& w : words) {
    x ^= x << 13, x ^= x >> 17, x ^= x << 5;  // xorshift32
    w = static_cast<uint16_t>(0x3c00u | (x & 0xffu) | ((x >> 16) & 0x8000u));
  }
  auto* bp = static_cast<char*>(p);
  size_t filled = std::min(bytes, kPatternBytes);
  bool ok = cudaMemcpy(bp, words.data(), filled, cudaMemcpyHostToDevice) == cudaSuccess;
  while (ok && filled < bytes) {  // doubling copies of what is filled
    const size_t n = std::min(filled, bytes - filled);
    ok = cudaMemcpy(bp + filled, bp, n, cudaMemcpyDeviceToDevice) == cudaSuccess;
    filled += n;
  }
  if (!ok) {
    cudaGetLastError();
    ok_ = false;
    return nullptr;
  }
  return p;
}

size_t fastestCandidate(size_t count, const std::function<bool(size_t)>& run, CandidateTiming timing) {
  cudaEvent_t start, stop;
  if (cudaEventCreate(&start) != cudaSuccess) return 0;
  if (cudaEventCreate(&stop) != cudaSuccess) {
    cudaEventDestroy(start);
    return 0;
  }
  std::vector<float> perRun(count, -1);
  if (timing == CandidateTiming::Sustained) {
    perRun = sustainedTimes(count, run, start, stop);
  } else {
    for (size_t i = 0; i < count; ++i)
      if (run(i)) perRun[i] = timeRuns(i, kTimedRuns, run, start, stop);
  }
  cudaDeviceSynchronize();
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return fastestIndex(perRun);
}

}  // namespace tpc::cuda
