// Multi-tensor casts on the GPU (runtime/cuda/cast_groups.h): the kernel gives the per-node cast kernels' bits
// and the CPU backend's cast (cast_group_cases.h, as the CPU-emulator test, here with gpt2-sized tensors and
// more chunks than blocks); in the backend, bf16 training steps with the cast group give the same losses and
// state, bit for bit, as with a kernel per cast, in all but 1 launch per parameter cast fewer; and the bf16
// copies the AdamW kernels keep (adamw_groups.h) give the bits of casting every step, after a state write and
// a NaN step too.
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

namespace {

// TPC_MEMBW_OFF for one backend's prepare (read there), given back after.
struct MembwOff {
  std::string saved;
  bool had = false;
  explicit MembwOff(const char* v) {
    if (const char* e = std::getenv("TPC_MEMBW_OFF")) had = true, saved = e;
    setenv("TPC_MEMBW_OFF", v, 1);
  }
  ~MembwOff() {
    if (had) setenv("TPC_MEMBW_OFF", saved.c_str(), 1);
    else unsetenv("TPC_MEMBW_OFF");
  }
};

// A CUDA backend prepared for `step`, with or without the cast groups, under TPC_MEMBW_OFF=`membwOff`.
std::unique_ptr<Backend> preparedCuda(const Graph& step, const TensorMap& state, bool multiTensorCasts, const char* membwOff) {
  CudaOptions o;
  o.verbose = false;
  o.multiTensorCasts = multiTensorCasts;
  auto b = createCudaBackend({}, o);
  MembwOff off(membwOff);
  Status st = b->prepare(step, state);
  INFO((st.ok() ? std::string() : st.error()));
  REQUIRE(st.ok());
  return b;
}

}  // namespace

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
    // Without the kept bf16 copies (the test below): they put the updates of the parameters cast and of the
    // others into two AdamW groups, one launch more.
    auto b = preparedCuda(*step, state, group, "adamcopy");
    auto info = cudaStepGraphInfo(*b);
    REQUIRE(info);
    launches.push_back(info->launches);
    for (int64_t i = 1; i <= 3; ++i) {
      auto out = b->step(batch(i, 1e-2f), i);
      REQUIRE(out.ok());
      REQUIRE(out->count("loss"));
      losses[group ? 0 : 1][std::to_string(i)] = adamw::bytesOf(out->at("loss"));
    }
    after.push_back(stateBytes(*b, *step));
  }
  CHECK(losses[0] == losses[1]);
  CHECK(after[0] == after[1]);
  WARN("launches per step: " << launches[1] << " with a kernel per cast, " << launches[0] << " with the cast group ("
                             << casts << " parameter casts)");
  CHECK(launches[0] == launches[1] - (casts - 1));
}


TEST_CASE("cuda cast group: the bf16 copies the AdamW kernels keep give the bits of casting every step, after a "
          "state write and a NaN step too", "[gpu][cast-group][adamw]") {
  requireGpuOrSkip();
  auto step = gptStep(smallGpt(), 2, "mixed-precision(dtype=bf16)," + kTrainPasses + ",fuse");
  TensorMap state;
  for (const Value* p : step->params()) state[p->name()] = initParam(*p, 7);
  std::vector<std::vector<std::string>> losses(2);
  std::vector<std::map<std::string, std::string>> after;
  std::vector<int64_t> kept;
  for (bool copies : {true, false}) {
    auto& l = losses[copies ? 0 : 1];
    auto b = preparedCuda(*step, state, true, copies ? "" : "adamcopy");
    auto info = cudaStepGraphInfo(*b);
    REQUIRE(info);
    kept.push_back(info->keptCopies);
    auto run = [&](int64_t i) {
      auto out = b->step(batch(i, 1e-2f), i);
      REQUIRE(out.ok());
      REQUIRE(out->count("loss"));
      l.push_back(adamw::bytesOf(out->at("loss")));
      return isNonFiniteStep(*out);
    };
    for (int64_t i = 1; i <= 3; ++i) CHECK_FALSE(run(i));
    // A state write (as a checkpoint load does): the kept copy of wte is stale until the next step casts it.
    auto wte = b->readState("wte");
    REQUIRE(wte.ok());
    HostTensor halved = wte->clone();
    for (int64_t k = 0; k < halved.numel(); ++k) halved.data<float>()[k] *= 0.5f;
    REQUIRE(b->writeState("wte", halved).ok());
    CHECK_FALSE(run(4));
    // A NaN parameter: a skipped step, then the parameter given back and two more steps.
    auto wpe = b->readState("wpe");
    REQUIRE(wpe.ok());
    HostTensor poisoned = wpe->clone();
    poisoned.data<float>()[3] = NAN;
    REQUIRE(b->writeState("wpe", poisoned).ok());
    CHECK(run(5));
    REQUIRE(b->writeState("wpe", *wpe).ok());
    CHECK_FALSE(run(6));
    CHECK_FALSE(run(7));
    after.push_back(stateBytes(*b, *step));
  }
  int64_t casts = 0;
  for (const Node* n : step->nodes()) casts += n->op() == OpKind::Cast && n->operand(0)->isParam() && fusionGroupOf(*n) < 0;
  WARN("bf16 copies kept by the AdamW kernels: " << kept[0] << " of " << casts << " parameter casts");
  CHECK(kept[0] > 0);
  CHECK(kept[1] == 0);
  CHECK(losses[0] == losses[1]);
  CHECK(after[0] == after[1]);
}
