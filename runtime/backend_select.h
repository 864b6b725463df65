// Choosing the backend a run uses: CUDA when this build has it and a GPU is present, else the CPU
// reference backend; --backend cpu|cuda forces one.
#pragma once

#include <string>
#include <vector>

#include "ir/status.h"

namespace tpc {

enum class BackendKind { Cpu, Cuda };

bool cudaBackendBuilt();
// "auto", "cpu" or "cuda"; asking for cuda where there is none is an error saying why.
Result<BackendKind> selectBackend(const std::string& requested);
// One or two lines for `tpc --version`: whether CUDA is built and which devices are visible.
std::string backendSummary();
// The NVIDIA GPUs the kernel driver lists under PROC/driver/nvidia/gpus, whatever this build can use: for
// `tpc doctor` of a build without CUDA. Each is its model name (from the entry's information file) or, where
// that file cannot be read, its PCI bus id. Empty without the driver.
std::vector<std::string> nvidiaGpusOnHost(const std::string& proc = "/proc");

}  // namespace tpc
