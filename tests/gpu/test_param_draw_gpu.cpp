// Parameters drawn on the GPU (runtime/cuda/param_draw.h): the CUDA backend draws initParam's deferred
// normal parameters into device memory without making their host copies, and they hold the host draw's bits.
#include <cuda_runtime.h>

#include <catch2/catch.hpp>

#include <cstring>

#include "gpt_step_support.h"
#include "gpu_test_support.h"
#include "runtime/cuda/cuda_backend.h"
#include "runtime/param_init.h"

using namespace tpc;
using namespace tpc::test;

TEST_CASE("cuda param draw: the backend draws the normal parameters on the GPU with the host draw's bits",
          "[gpu][param_init]") {
  requireGpuOrSkip();
  auto step = gptStep(smallGpt(), 2, kTrainPasses + ",fuse");
  TensorMap state;
  for (const Value* p : step->params()) state[p->name()] = initParam(*p, 11);
  CudaOptions o;
  o.verbose = false;
  auto backend = createCudaBackend({}, o);
  Status st = backend->prepare(*step, state);
  INFO((st.ok() ? std::string() : st.error()));
  REQUIRE(st.ok());
  int drawn = 0, compared = 0;
  for (const Value* p : step->params()) {
    INFO(p->name());
    // Still pending: the backend never made the host copy.
    if (state[p->name()].pendingNormalDraw()) ++drawn;
    auto got = backend->readState(p->name());
    REQUIRE(got.ok());
    HostTensor want = initParam(*p, 11);  // drawn on the host when read
    REQUIRE(got->bytes() == want.bytes());
    CHECK(std::memcmp(got->raw(), std::as_const(want).raw(), want.bytes()) == 0);
    ++compared;
  }
  CHECK(drawn >= 6);  // wte, wpe and each layer's four weight matrices at least
  CHECK(compared == static_cast<int>(step->params().size()));
}
