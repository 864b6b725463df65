// Timing a library's candidates (candidate_timing.h).
#include "runtime/cuda/candidate_timing.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>

namespace tpc::cuda {
namespace {

// Quick: runs per candidate, one to warm up (and to see it runs at all), then the timed ones.
constexpr int kTimedRuns = 5;
// Sustained: the GPU heated this long before the rounds, each candidate run this long a round, in this many
// rounds (a power cap's clock settles within a few ms of a change in the draw).
constexpr float kHeatMs = 300, kRoundMs = 40;
constexpr int kRounds = 3;

std::atomic<CandidateTiming> gTiming{CandidateTiming::Quick};

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

// The sustained ranking (candidate_timing.h): per-run ms per candidate, the median of kRounds rounds; negative
// for candidates that cannot run.
std::vector<float> sustainedTimes(size_t count, const std::function<bool(size_t)>& run, cudaEvent_t start, cudaEvent_t stop) {
  std::vector<float> perRun(count, -1);
  std::vector<int> runs(count, 0);
  size_t first = count;
  for (size_t i = 0; i < count; ++i) {
    if (!run(i)) continue;
    float ms = timeRuns(i, 3, run, start, stop);
    if (ms <= 0) continue;
    runs[i] = std::clamp(static_cast<int>(kRoundMs / (ms / 3)), 3, 100000);
    if (first == count) first = i;
  }
  if (first == count) return perRun;
  timeRuns(first, std::max(1, static_cast<int>(runs[first] * kHeatMs / kRoundMs)), run, start, stop);
  std::vector<std::vector<float>> rounds(count);
  for (int r = 0; r < kRounds; ++r)
    for (size_t j = 0; j < count; ++j) {
      size_t i = (j + static_cast<size_t>(r)) % count;  // rotated: no candidate always follows the same one
      if (runs[i] == 0) continue;
      float ms = timeRuns(i, runs[i], run, start, stop);
      if (ms > 0) rounds[i].push_back(ms / static_cast<float>(runs[i]));
    }
  for (size_t i = 0; i < count; ++i) {
    std::vector<float>& v = rounds[i];
    if (v.size() != kRounds) continue;
    std::sort(v.begin(), v.end());
    perRun[i] = v[kRounds / 2];
  }
  return perRun;
}

}  // namespace

Result<CandidateTiming> candidateTimingFromEnv() {
  const char* e = std::getenv("TPC_AUTOTUNE_SUSTAINED");
  if (!e || !*e || std::string(e) == "0") return CandidateTiming::Quick;
  if (std::string(e) == "1") return CandidateTiming::Sustained;
  return makeError("TPC_AUTOTUNE_SUSTAINED must be 0 or 1, got '", e, "'");
}

void setCandidateTiming(CandidateTiming t) { gTiming = t; }
CandidateTiming candidateTiming() { return gTiming; }
std::string candidateTimingKey() { return gTiming == CandidateTiming::Sustained ? " | sustained" : ""; }

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
  if (gTiming == CandidateTiming::Quick) {
    cudaMemset(p, 0x3c, bytes);
    return p;
  }
  std::vector<uint16_t> words((bytes + 1) / 2);
  uint32_t x = 0x9e3779b9u;
  for (uint16_t& w : words) {
    x ^= x << 13, x ^= x >> 17, x ^= x << 5;  // xorshift32
    w = static_cast<uint16_t>(0x3c00u | (x & 0xffu) | (x >> 16 & 0x8000u));
  }
  cudaMemcpy(p, words.data(), bytes, cudaMemcpyHostToDevice);
  return p;
}

size_t fastestCandidate(size_t count, const std::function<bool(size_t)>& run) {
  cudaEvent_t start, stop;
  if (cudaEventCreate(&start) != cudaSuccess) return 0;
  if (cudaEventCreate(&stop) != cudaSuccess) {
    cudaEventDestroy(start);
    return 0;
  }
  std::vector<float> perRun(count, -1);
  if (gTiming == CandidateTiming::Sustained) {
    perRun = sustainedTimes(count, run, start, stop);
  } else {
    for (size_t i = 0; i < count; ++i)
      if (run(i)) perRun[i] = timeRuns(i, kTimedRuns, run, start, stop);
  }
  size_t best = 0;
  for (size_t i = 0; i < count; ++i)
    if (perRun[i] >= 0 && (perRun[best] < 0 || perRun[i] < perRun[best])) best = i;
  cudaDeviceSynchronize();
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return best;
}

}  // namespace tpc::cuda
