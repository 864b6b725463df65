// Multi-tensor casts on the GPU (runtime/cuda/cast_groups.h): the kernel gives the per-node cast kernels' bits
// and the CPU backend's cast (cast_group_cases.h, as the CPU-emulator test, here with gpt2-sized tensors and
// more chunks than blocks); in the backend, bf16 training steps with the cast group give the same losses and
// state, bit for bit, as with a kernel per cast, in all but 1 launch per parameter cast fewer.
#include <cuda_runtime.h>

#include <catch2/catch.hpp>

#include <random>

#include "cast_group_cases.h"
#include "gpt_step_support.h"
#include "gpu_device.h"
#include "gpu_step_compare.h"
#include "gpu_test_support.h"
#include "runtime/cuda/cuda_backend.h"
#include "runtime/param_init.h"

using namespace tpc;
using namespace tpc::test;

TEST_CASE("cuda cast group: the multi-tensor cast gives the per-node kernels' bits and the CPU backend's cast",
          "[gpu][cast-group]") {
  requireGpuOrSkip();
  cudaDeviceProp prop{};
  CUDA_OK(cudaGetDeviceProperties(&prop, 0));
  GpuDevice d(prop.major * 10 + prop.minor);
  const DType f = DType::f32, bf = DType::bf16, h = DType::f16;
  // wte's 50304 x 768 alone is 4716 chunks: the 2048 blocks stride over them.
  CHECK(castgroup::checkCastGroups(d, {{f, bf}, {bf, f}, {f, h}, {h, f}, {bf, h}, {h, bf}},
                                   {1, 2, 3, 7, 8, 9, 17, 768, 8192, 8193, 2304 * 768, (1 << 20) + 3, 50304 * 768}, 20,
                                   100000) > 0);
}

TEST_CASE("cuda cast group: bf16 training steps with the cast group give the same losses and state bit for bit, "
          "with a launch per parameter cast fewer but one", "[gpu][cast-group]") {
  requireGpuOrSkip();
  auto step = gptStep(smallGpt(), 2, "mixed-precision(dtype=bf16)," + kTrainPasses + ",fuse");
  int64_t casts = 0;
  for (const Node* n : step->nodes()) casts += n->op() == OpKind::Cast && n->operand(0)->isParam() && fusionGroupOf(*n) < 0;
  REQUIRE(casts > 2);
  TensorMap state;
  for (const Value* p : step->params()) state[p->name()] = initParam(*p, 5);
  std::vector<std::map<std::string, std::string>> after, losses(2);
  std::vector<int64_t> launches;
  for (bool group : {true, false}) {
    CudaOptions o;
    o.verbose = false;
    o.multiTensorCasts = group;
    auto b = createCudaBackend({}, o);
    Status st = b->prepare(*step, state);
    INFO((st.ok() ? std::string() : st.error()));
    REQUIRE(st.ok());
    auto info = cudaStepGraphInfo(*b);
    REQUIRE(info);
    launches.push_back(info->launches);
    for (int64_t i = 1; i <= 3; ++i) {
      auto out = b->step(batch(i, 1e-2f), i);
      REQUIRE(out.ok());
      REQUIRE(out->count("loss"));
      const HostTensor& l = out->at("loss");
      losses[group ? 0 : 1][std::to_string(i)] = std::string(reinterpret_cast<const char*>(l.raw()), l.bytes());
    }
    after.push_back(stateBytes(*b, *step));
  }
  CHECK(losses[0] == losses[1]);
  CHECK(after[0] == after[1]);
  WARN("launches per step: " << launches[1] << " with a kernel per cast, " << launches[0] << " with the cast group ("
                             << casts << " parameter casts)");
  CHECK(launches[0] == launches[1] - (casts - 1));
}
