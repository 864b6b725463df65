// For GPU tests: skip (exit 77, CTest's "skipped") when this machine has no usable GPU.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <string>

#include "runtime/cuda/device_info.h"

namespace tpc::test {

inline void requireGpuOrSkip() {
  std::string why;
  if (!cuda::listDevices(&why).empty()) return;
  std::printf("SKIPPED: no GPU (%s); this test runs on the GPU machine (scripts/gpu_check.sh)\n", why.c_str());
  std::fflush(stdout);
  std::_Exit(77);
}

}  // namespace tpc::test
