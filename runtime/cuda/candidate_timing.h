// Timing a library's candidates for one problem (cuBLASLt's algorithms, cuDNN's engine configs) on scratch
// buffers, to keep the fastest (matmul_autotune.h, cudnn_attention.h).
#pragma once

#include <cstddef>
#include <functional>
#include <string>
#include <vector>

#include "ir/status.h"

namespace tpc::cuda {

// How candidates are timed. Quick (the default): 5 runs each after one to warm up, on scratch of one repeated
// value, in a few ms, while the GPU is still cool and at its highest clock. Sustained (TPC_AUTOTUNE_SUSTAINED=1,
// for measuring): scratch of varied bits (tensor cores draw more power on varied data), the GPU heated first,
// then each candidate settled for a few ms and run back to back for about 40 ms, in three rounds of different
// orders (candidateOrder), the median kept: under a power cap the clock falls to what a kernel draws, so this
// ranks by the rate in a sustained step.
enum class CandidateTiming { Quick, Sustained };
// TPC_AUTOTUNE_SUSTAINED: unset, empty or 0: Quick; 1: Sustained; anything else: an error naming the value.
// The CUDA backend reads it at prepare and gives it to its CublasLtMatmul and CudnnAttention.
Result<CandidateTiming> candidateTimingFromEnv();
// What a remembered choice's key adds: "" for Quick, " | sustained" for Sustained (the two rankings are kept
// apart in the cache).
std::string candidateTimingKey(CandidateTiming t);

// The sustained ranking's pure parts. The order of round r (0, 1, 2) over `count` candidates: forward, reversed,
// then the even indices before the odd ones, so that no candidate follows the same one in every round (a
// neighbour that drew more power leaves a lower clock behind).
std::vector<size_t> candidateOrder(size_t count, int round);
// The median of an odd count of times (the upper middle one of an even count); -1 for none.
float medianTime(std::vector<float> times);
// The index of the least non-negative time, the first of equal ones; 0 when every time is negative (none ran).
size_t fastestIndex(const std::vector<float>& times);

// Device memory freed on scope exit.
class DeviceScratch {
 public:
  explicit DeviceScratch(CandidateTiming timing = CandidateTiming::Quick) : timing_(timing) {}
  DeviceScratch(const DeviceScratch&) = delete;
  DeviceScratch& operator=(const DeviceScratch&) = delete;
  ~DeviceScratch();
  // `bytes` of device memory of small finite values. Quick: 0x3c bytes, 0.0115 in bf16 and f32, 1.06 in f16
  // (all-zero inputs would flatter the tensor cores' power draw). Sustained: 16-bit words 0x3cXX or 0xbcXX, a
  // varied low byte and sign, finite in bf16, f16 and f32 alike, from a 1 MiB pattern seeded per buffer and
  // repeated on the device. Null for 0 bytes; null with ok() false where cudaMalloc or the fill failed.
  void* get(size_t bytes);
  bool ok() const { return ok_; }

 private:
  CandidateTiming timing_;
  std::vector<void*> ptrs_;
  bool ok_ = true;
};

// The index of the candidate whose run(i) (enqueued on the default stream; false: it cannot run) is fastest
// under `timing`; 0 when none could be timed.
size_t fastestCandidate(size_t count, const std::function<bool(size_t)>& run,
                        CandidateTiming timing = CandidateTiming::Quick);

}  // namespace tpc::cuda
