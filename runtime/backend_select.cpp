// Backend selection.
#include "runtime/backend_select.h"

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

}  // namespace tpc
