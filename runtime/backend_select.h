// Choosing the backend a run uses: CUDA when this build has it and a GPU is present, else the CPU
// reference backend; --backend cpu|cuda forces one.
#pragma once

#include <string>

#include "ir/status.h"

namespace tpc {

enum class BackendKind { Cpu, Cuda };

bool cudaBackendBuilt();
// "auto", "cpu" or "cuda"; asking for cuda where there is none is an error saying why.
Result<BackendKind> selectBackend(const std::string& requested);
// One or two lines for `tpc --version`: whether CUDA is built and which devices are visible.
std::string backendSummary();

}  // namespace tpc
