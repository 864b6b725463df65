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
// then each candidate run back to back for about 40 ms, three rounds in rotated order, the median kept: under
// a power cap the clock falls to what a kernel draws, so this ranks by the rate in a sustained step.
enum class CandidateTiming { Quick, Sustained };
// TPC_AUTOTUNE_SUSTAINED: unset, empty or 0: Quick; 1: Sustained; anything else: an error naming the value.
Result<CandidateTiming> candidateTimingFromEnv();
// Set once per process by the backend (default Quick); read by fastestCandidate and the keys below.
void setCandidateTiming(CandidateTiming t);
CandidateTiming candidateTiming();
// What a remembered choice's key adds for the current timing: "" for Quick, " | sustained" for Sustained
// (the two rankings are kept apart in the cache).
std::string candidateTimingKey();

// Device memory freed on scope exit.
class DeviceScratch {
 public:
  DeviceScratch() = default;
  DeviceScratch(const DeviceScratch&) = delete;
  DeviceScratch& operator=(const DeviceScratch&) = delete;
  ~DeviceScratch();
  // `bytes` of device memory of small finite values (0x3c bytes: 0.0115 in bf16 and f32, 1.06 in f16; all-zero
  // inputs would flatter the tensor cores' power draw; under Sustained timing each 16-bit word is 0x3cXX with
  // a varied low byte and sign, finite in bf16, f16 and f32 alike); null for 0 bytes, and null with ok() false
  // where cudaMalloc failed.
  void* get(size_t bytes);
  bool ok() const { return ok_; }

 private:
  std::vector<void*> ptrs_;
  bool ok_ = true;
};

// The index of the candidate whose run(i) (enqueued on the default stream; false: it cannot run) is fastest
// under candidateTiming(); 0 when none could be timed.
size_t fastestCandidate(size_t count, const std::function<bool(size_t)>& run);

}  // namespace tpc::cuda
