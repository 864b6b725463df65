// CUDA device discovery through the runtime API.
#include "runtime/cuda/device_info.h"

#include <cuda_runtime_api.h>

namespace tpc::cuda {

std::vector<DeviceInfo> listDevices(std::string* why) {
  std::vector<DeviceInfo> out;
  int n = 0;
  cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess) {
    // Without a driver the runtime says "driver version is insufficient"; say what it means here.
    if (why)
      *why = (err == cudaErrorInsufficientDriver || err == cudaErrorNoDevice) ? "no NVIDIA GPU or driver on this machine"
                                                                               : cudaGetErrorString(err);
    return out;
  }
  for (int i = 0; i < n; ++i) {
    cudaDeviceProp p{};
    if (cudaGetDeviceProperties(&p, i) != cudaSuccess) continue;
    out.push_back({i, p.name, p.major, p.minor, p.totalGlobalMem});
  }
  if (out.empty() && why) *why = "no CUDA device found";
  return out;
}

std::string runtimeVersion() {
  int v = 0;
  cudaRuntimeGetVersion(&v);
  return std::to_string(v / 1000) + "." + std::to_string((v % 1000) / 10);
}

}  // namespace tpc::cuda
