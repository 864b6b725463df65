// For GPU tests: skip (exit 77, CTest's "skipped") when this machine has no usable GPU; CUDA_OK, a CUDA
// runtime call that fails the test with its error; two runs' losses compared.
#pragma once

#include <cuda_runtime.h>

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "runtime/cuda/device_info.h"
#include "worst_error.h"

#define CUDA_OK(expr)                                                      \
  do {                                                                     \
    cudaError_t e_ = (expr);                                               \
    if (e_ != cudaSuccess) FAIL(#expr << ": " << cudaGetErrorString(e_)); \
  } while (0)

namespace tpc::test {

inline void requireGpuOrSkip() {
  std::string why;
  if (!cuda::listDevices(&why).empty()) return;
  std::printf("SKIPPED: no GPU (%s); this test runs on the GPU machine (scripts/gpu_check.sh)\n", why.c_str());
  std::fflush(stdout);
  std::_Exit(77);
}

// The largest |got[i] - want[i]| / |want[i]| over two runs' losses of the same steps (a NaN loss, or runs of
// different lengths: infinite).
inline double worstRelativeDifference(const std::vector<double>& want, const std::vector<double>& got) {
  return worstRelError(got, want);
}

}  // namespace tpc::test
