// Factories of tpc's own passes; each pass's class stays private to its file (STYLE.md: MLIR layout).
#pragma once

#include <memory>

#include "passes/pass.h"

namespace tpc {

std::unique_ptr<Pass> createCSEPass();  // cse.cpp
std::unique_ptr<Pass> createDCEPass();  // dce.cpp
// accum, clip-grad, beta1, beta2, eps, weight-decay, loss: TrainingStepOptions (autodiff.h).
Result<std::unique_ptr<Pass>> createAutodiffPass(const PassOptions& options);  // autodiff.cpp

}  // namespace tpc
