// Multi-tensor AdamW on the GPU (runtime/cuda/adamw_groups.h): the kernel gives the per-tensor kernels' bits
// and a gated step changes nothing (adamw_group_cases.h, as the CPU-emulator test); in the backend, training
// steps with the multi-tensor kernel give the same state, bit for bit, as with one kernel per tensor, and a
// non-finite step after them leaves the state as it was with no copy of it kept.
#include <cuda_runtime.h>

#include <catch2/catch.hpp>

#include <cmath>
#include <random>

#include "adamw_group_cases.h"
#include "gpt_step_support.h"
#include "gpu_device.h"
#include "gpu_step_compare.h"
#include "gpu_test_support.h"
#include "models/gpt.h"
#include "passes/pipeline.h"
#include "runtime/cuda/cuda_backend.h"
#include "runtime/cuda/nvrtc_compiler.h"
#include "runtime/param_init.h"

using namespace tpc;
using namespace tpc::test;

TEST_CASE("cuda adamw: the multi-tensor kernel gives the per-tensor kernels' bits and a gated step changes nothing",
          "[gpu][adamw]") {
  requireGpuOrSkip();
  cudaDeviceProp prop{};
  CUDA_OK(cudaGetDeviceProperties(&prop, 0));
  GpuDevice d(prop.major * 10 + prop.minor);
  CHECK(adamw::checkAdamWGroups(d, {1, 2, 3, 4, 5, 17, 255, 768, 4096, 4097, 9001, 2304 * 768, (1 << 20) + 3}, 20, 100000) > 0);
}

TEST_CASE("cuda adamw: training steps with the multi-tensor kernel give the per-tensor state bit for bit and a NaN step "
          "after them changes nothing", "[gpu][adamw][nonfinite]") {
  requireGpuOrSkip();
  auto step = gptStep(smallGpt(), 2, kTrainPasses + ",fuse");
  TensorMap state;
  for (const Value* p : step->params()) state[p->name()] = initParam(*p, 5);
  std::vector<std::map<std::string, std::string>> after;
  std::vector<std::unique_ptr<Backend>> backends;
  for (bool multi : {true, false}) {
    CudaOptions o;
    o.verbose = false;
    o.multiTensorAdamW = multi;
    backends.push_back(createCudaBackend({}, o));
    Backend& b = *backends.back();
    Status st = b.prepare(*step, state);
    INFO((st.ok() ? std::string() : st.error()));
    REQUIRE(st.ok());
    for (int64_t i = 1; i <= 3; ++i) {
      auto out = b.step(batch(i, 1e-2f), i);
      REQUIRE(out.ok());
      CHECK_FALSE(isNonFiniteStep(*out));
    }
    after.push_back(stateBytes(b, *step));
  }
  CHECK(after[0] == after[1]);
  // A NaN written into a parameter: the next step's loss is NaN, and the kernel's gate holds back the whole
  // update (the backend keeps no copy of this state: tests/unit/test_adamw_multi.cpp).
  Backend& b = *backends[0];
  auto wpe = b.readState("wpe");
  REQUIRE(wpe.ok());
  HostTensor poisoned = *wpe;
  poisoned.data<float>()[3] = NAN;
  REQUIRE(b.writeState("wpe", poisoned).ok());
  auto before = stateBytes(b, *step);
  auto out = b.step(batch(4, 1e-2f), 4);
  REQUIRE(out.ok());
  CHECK(isNonFiniteStep(*out));
  CHECK(stateBytes(b, *step) == before);
}
