// Non-finite steps on the GPU (backend.h, tpc run --on-nan): a step whose loss is NaN leaves the state bit
// for bit as it was (the CUDA graph updates it in place, by AdamW kernels gated on the loss and grad_norm), and
// findFirstNonFinite names the same first non-finite value as the CPU backend, on one rank and on virtual
// ranks, without changing the state. fp16 with dynamic loss scaling, which relies on that, follows the
// CPU backend's fp16 run: the same steps overflow and are skipped, the losses agree.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <random>
#include <sstream>

#include "gpt_step_support.h"
#include "gpu_test_support.h"
#include "runtime/cpu/cpu_backend.h"
#include "runtime/cpu/cpu_mesh_backend.h"
#include "runtime/cuda/cuda_backend.h"
#include "runtime/param_init.h"
#include "runtime/trainer.h"

namespace tpc {
namespace {

std::unique_ptr<Graph> stepGraph(int64_t tp, const std::string& pre = "", const std::string& autodiff = "") {
  GptConfig g = test::smallGpt();
  g.layers = 1;
  return test::gptStep(g, 2, test::megatronTp(tp) + pre + "autodiff(clip-grad=1.0, weight-decay=0.1" + autodiff + "),cse,dce");
}

TensorMap batch() {
  std::mt19937 rng(11);
  return test::gptBatch(rng, {2, 16}, 100, 1e-2f, 1);
}


// Runs one step from `state` on the CPU (reference) and on the GPU, and compares what they say.
void compare(int64_t tp, const TensorMap& state, bool expectNonFiniteStep) {
  auto step = stepGraph(tp);
  CpuOptions o;
  o.threads = 2;
  std::unique_ptr<Backend> cpu = tp > 1 ? createCpuMeshBackend(test::rankGraphs(*step), o) : createCpuBackend(o);
  CudaOptions co;
  co.verbose = false;
  co.collectives = "virtual";
  std::unique_ptr<Backend> gpu = createCudaBackend(test::rankGraphs(*step), co);
  // megatron-tp views the fused QKV weight and bias as [D, 3, D] and [3, D]: the bytes of the model's [D, 3D]
  // and [3D], so the state goes in the step's own shapes.
  TensorMap local;
  for (const Value* p : step->params()) {
    HostTensor t = state.at(p->name());
    if (t.shape() != p->shape()) {
      HostTensor viewed(TensorType(t.dtype(), p->shape()));
      REQUIRE(viewed.bytes() == t.bytes());
      std::memcpy(viewed.raw(), t.raw(), t.bytes());
      t = viewed;
    }
    local[p->name()] = t;
  }
  for (Backend* b : {cpu.get(), gpu.get()}) {
    Status st = b->prepare(*step, local);
    INFO(b->name() << ": " << (st.ok() ? std::string() : st.error()));
    REQUIRE(st.ok());
  }
  TensorMap in = batch();
  auto before = test::stateBytes(*gpu, *step);
  auto outCpu = cpu->step(in, 1);
  auto outGpu = gpu->step(in, 1);
  REQUIRE(outCpu.ok());
  INFO((outGpu.ok() ? std::string() : outGpu.error()));
  REQUIRE(outGpu.ok());
  CHECK(isNonFiniteStep(*outCpu) == expectNonFiniteStep);
  CHECK(isNonFiniteStep(*outGpu) == expectNonFiniteStep);
  CHECK(test::stateBytes(*gpu, *step) == before);  // the state the step left: exactly the one before it

  auto want = cpu->findFirstNonFinite(in, 1);
  auto got = gpu->findFirstNonFinite(in, 1);
  REQUIRE(want.ok());
  INFO((got.ok() ? std::string() : got.error()));
  REQUIRE(got.ok());
  REQUIRE(want->has_value());
  REQUIRE(got->has_value());
  INFO("CPU: " << (*want)->describe() << "\nGPU: " << (*got)->describe());
  CHECK((*got)->value == (*want)->value);
  CHECK((*got)->node == (*want)->node);
  CHECK((*got)->index == (*want)->index);
  // (numNodes is not compared: the CUDA backend's own rewrites, e.g. fold-batch-matmul-sum, add nodes.)
  CHECK((*got)->rank == (*want)->rank);
  CHECK((*got)->element == (*want)->element);
  CHECK(std::isnan((*got)->sample) == std::isnan((*want)->sample));
  CHECK(test::stateBytes(*gpu, *step) == before);  // checking mode changed nothing either

  // And the GPU goes on training from the kept state: the same step with a finite state would be fine.
  auto again = gpu->step(in, 1);
  REQUIRE(again.ok());
  CHECK(isNonFiniteStep(*again) == expectNonFiniteStep);
}

}  // namespace

TEST_CASE("cuda non-finite: a NaN parameter: the state is kept, checking mode names it as the CPU does", "[gpu][nonfinite]") {
  test::requireGpuOrSkip();
  auto step = stepGraph(1);
  for (int64_t tp : {1, 2}) {
    INFO("tp " << tp);
    TensorMap state = test::initialState(*step, 1);
    state["h.0.mlp.c_fc.weight"].data<float>()[5] = NAN;
    compare(tp, state, true);
  }
}

TEST_CASE("cuda non-finite: an overflow inside the step is named at the same node as on the CPU", "[gpu][nonfinite]") {
  test::requireGpuOrSkip();
  auto step = stepGraph(1);
  for (int64_t tp : {1, 2}) {
    INFO("tp " << tp);
    // Column 0 of both embeddings at 3e38: finite parameters whose sum (the residual stream) is inf.
    TensorMap state = test::initialState(*step, 1);
    for (const char* name : {"wte", "wpe"}) {
      HostTensor& t = state[name];
      const int64_t cols = t.shape().back();
      for (int64_t i = 0; i < t.numel(); i += cols) t.data<float>()[i] = 3e38f;
    }
    compare(tp, state, true);
  }
}

namespace {

struct RandomBatches : test::LearnableBatches {
  RandomBatches() : LearnableBatches(50, 5) {}
};

}  // namespace

TEST_CASE("cuda fp16: dynamic loss scaling skips the same overflowed steps as the CPU and follows its losses", "[gpu][fp16]") {
  test::requireGpuOrSkip();
  auto step = stepGraph(1, "mixed-precision(dtype=f16),", ", loss-scale=true");
  CpuOptions o;
  o.threads = 2;
  CudaOptions co;
  co.verbose = false;
  std::vector<TrainReport> reports;
  std::vector<std::unique_ptr<Backend>> backends;
  backends.push_back(createCpuBackend(o));
  backends.push_back(createCudaBackend({}, co));
  for (auto& b : backends) {
    Status st = b->prepare(*step, test::initialState(*step, 1));
    INFO(b->name() << ": " << (st.ok() ? std::string() : st.error()));
    REQUIRE(st.ok());
    TrainerSettings s;
    s.trainIters = 30;
    s.logInterval = 0;
    s.console = false;
    s.lr.maxLr = s.lr.minLr = 3e-3;
    s.lr.warmupIters = 0;
    s.lr.decayIters = 30;
    s.lossScaling = LossScaleSettings{std::ldexp(1.0, 40), 4, 1};  // overflows until the scale comes down
    RandomBatches data;
    std::ostringstream console;
    auto r = train(*b, *step, data, s, console);
    INFO(b->name() << ": " << (r.ok() ? std::string() : r.error()));
    REQUIRE(r.ok());
    reports.push_back(*r);
  }
  const TrainReport &cpu = reports[0], &gpu = reports[1];
  WARN("fp16 with loss scaling, 30 steps from scale 2^40: CPU skipped " << cpu.skippedSteps.size() << ", GPU skipped "
       << gpu.skippedSteps.size() << "; final scale CPU " << cpu.end.lossScale << ", GPU " << gpu.end.lossScale
       << "; last loss CPU " << cpu.losses.back() << ", GPU " << gpu.losses.back());
  CHECK(cpu.skippedSteps.size() >= 10);
  // The overflow steps come from fp16 range limits, not rounding: both backends skip the same ones.
  CHECK(gpu.skippedSteps == cpu.skippedSteps);
  CHECK(gpu.end.lossScale == cpu.end.lossScale);
  REQUIRE(gpu.losses.size() == cpu.losses.size());
  for (size_t i = 0; i < cpu.losses.size(); ++i) CHECK(std::abs(gpu.losses[i] - cpu.losses[i]) <= 2e-2 * cpu.losses[i]);
}

}  // namespace tpc
