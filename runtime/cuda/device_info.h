// What CUDA devices this process can see (used to pick the backend and by `tpc --version`).
#pragma once

#include <string>
#include <vector>

namespace tpc::cuda {

struct DeviceInfo {
  int index = 0;
  std::string name;
  int major = 0, minor = 0;  // compute capability
  size_t totalMemory = 0;
};

// Devices visible to this process; empty (with `why` set) when there is no driver or no GPU.
std::vector<DeviceInfo> listDevices(std::string* why = nullptr);
std::string runtimeVersion();

}  // namespace tpc::cuda
