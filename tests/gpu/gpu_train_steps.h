// For GPU tests that train the small GPTs of fusion_test_support.h under two settings: ten steps on one GPU
// (seed 99, batches from rng 7), with the losses, the launches a step and the step graph's counts.
#pragma once

#include <optional>
#include <random>
#include <vector>

#include "fusion_test_support.h"
#include "runtime/cuda/cuda_backend.h"

namespace tpc::test {

struct TenSteps {
  std::vector<double> losses;
  int64_t launches = 0;
  std::optional<CudaStepGraphInfo> info;  // none in TPC_CUDA_DEBUG mode
};

inline TenSteps trainTenSteps(const Graph& g, CudaOptions o) {
  o.seed = 99;
  o.verbose = false;
  auto backend = createCudaBackend({}, o);
  prepareInitialState(*backend, g, 1);
  std::mt19937 rng(7);
  TenSteps run;
  run.losses = trainLosses(*backend, rng, 10);
  run.launches = backend->launchesPerStep();
  run.info = cudaStepGraphInfo(*backend);
  return run;
}

}  // namespace tpc::test
