// Factories of tpc's own passes; each pass's class stays private to its file (STYLE.md: MLIR layout).
#pragma once

#include <memory>

#include "passes/pass.h"

namespace tpc {

std::unique_ptr<Pass> createCSEPass();  // cse.cpp
std::unique_ptr<Pass> createDCEPass();  // dce.cpp

}  // namespace tpc
