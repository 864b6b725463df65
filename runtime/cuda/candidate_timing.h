// Timing a library's candidates for one problem (cuBLASLt's algorithms, cuDNN's engine configs) on scratch
// buffers, to keep the fastest (matmul_autotune.h, cudnn_attention.h).
#pragma once

#include <cstddef>
#include <functional>
#include <vector>

namespace tpc::cuda {

// Device memory freed on scope exit.
class DeviceScratch {
 public:
  DeviceScratch() = default;
  DeviceScratch(const DeviceScratch&) = delete;
  DeviceScratch& operator=(const DeviceScratch&) = delete;
  ~DeviceScratch();
  // `bytes` of device memory of small finite values (0x3c bytes: 0.0115 in bf16 and f32, 1.06 in f16; all-zero
  // inputs would flatter the tensor cores' power draw); null for 0 bytes, and null with ok() false where
  // cudaMalloc failed.
  void* get(size_t bytes);
  bool ok() const { return ok_; }

 private:
  std::vector<void*> ptrs_;
  bool ok_ = true;
};

// The index of the candidate whose run(i) (enqueued on the default stream; false: it cannot run) is fastest
// over 5 runs after one to warm up; 0 when none could be timed.
size_t fastestCandidate(size_t count, const std::function<bool(size_t)>& run);

}  // namespace tpc::cuda
