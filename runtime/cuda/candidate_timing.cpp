// Timing a library's candidates (candidate_timing.h).
#include "runtime/cuda/candidate_timing.h"

#include <cuda_runtime_api.h>

namespace tpc::cuda {
namespace {

// Runs per candidate: one to warm up (and to see it runs at all), then the timed ones.
constexpr int kTimedRuns = 5;

}  // namespace

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
  cudaMemset(p, 0x3c, bytes);
  return p;
}

size_t fastestCandidate(size_t count, const std::function<bool(size_t)>& run) {
  cudaEvent_t start, stop;
  if (cudaEventCreate(&start) != cudaSuccess) return 0;
  if (cudaEventCreate(&stop) != cudaSuccess) {
    cudaEventDestroy(start);
    return 0;
  }
  size_t best = 0;
  float bestMs = -1;
  for (size_t i = 0; i < count; ++i) {
    if (!run(i)) continue;
    cudaEventRecord(start, nullptr);
    bool ran = true;
    for (int k = 0; k < kTimedRuns && ran; ++k) ran = run(i);
    cudaEventRecord(stop, nullptr);
    float ms = 0;
    if (!ran || cudaEventSynchronize(stop) != cudaSuccess || cudaEventElapsedTime(&ms, start, stop) != cudaSuccess) continue;
    if (bestMs < 0 || ms < bestMs) best = i, bestMs = ms;
  }
  cudaDeviceSynchronize();
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return best;
}

}  // namespace tpc::cuda
