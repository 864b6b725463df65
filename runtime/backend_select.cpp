// Backend selection.
#include "runtime/backend_select.h"

#include <algorithm>
#include <filesystem>
#include <fstream>

#ifdef TPC_HAVE_CUDA
#include "runtime/cuda/device_info.h"
#endif

namespace tpc {

bool cudaBackendBuilt() {
#ifdef TPC_HAVE_CUDA
  return true;
#else
  return false;
#endif
}

Result<BackendKind> selectBackend(const std::string& requested) {
  if (requested == "cpu") return BackendKind::Cpu;
  if (requested != "auto" && requested != "cuda")
    return makeError("--backend=", requested, " is not a backend (expected auto, cpu or cuda)");
#ifdef TPC_HAVE_CUDA
  std::string why;
  bool haveGpu = !cuda::listDevices(&why).empty();
  if (haveGpu) return BackendKind::Cuda;
  if (requested == "cuda") return makeError("--backend=cuda: no usable GPU (", why, "); use --backend=cpu");
#else
  if (requested == "cuda")
    return makeError("--backend=cuda: this tpc was built without CUDA (rebuild with the CUDA toolkit installed, "
                     "or use --backend=cpu)");
#endif
  return BackendKind::Cpu;
}

std::string backendSummary() {
#ifdef TPC_HAVE_CUDA
  std::string s = "backends: cpu, cuda (CUDA runtime " + cuda::runtimeVersion() + ")";
  std::string why;
  auto devices = cuda::listDevices(&why);
  if (devices.empty()) return s + "\nGPUs: none (" + why + ")";
  for (const auto& d : devices)
    s += "\nGPU " + std::to_string(d.index) + ": " + d.name + " (sm_" + std::to_string(d.major) + std::to_string(d.minor) +
         ", " + std::to_string(d.totalMemory >> 30) + " GiB)";
  return s;
#else
  return "backends: cpu (built without CUDA)";
#endif
}

std::vector<std::string> nvidiaGpusOnHost(const std::string& proc) {
  namespace fs = std::filesystem;
  std::vector<std::pair<std::string, std::string>> found;  // PCI bus id (e.g. 0000:18:00.0), name
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(fs::path(proc) / "driver/nvidia/gpus", ec)) {
    std::string bus = e.path().filename().string(), name = bus;
    std::ifstream info(e.path() / "information");
    for (std::string line; std::getline(info, line);)
      if (line.rfind("Model:", 0) == 0) {
        size_t at = line.find_first_not_of(" \t", 6);
        if (at != std::string::npos) name = line.substr(at);
        break;
      }
    found.push_back({bus, name});
  }
  std::sort(found.begin(), found.end());
  std::vector<std::string> gpus;
  for (auto& [bus, name] : found) gpus.push_back(std::move(name));
  return gpus;
}

}  // namespace tpc
