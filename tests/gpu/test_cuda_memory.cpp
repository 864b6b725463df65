// The CUDA backend's memory-side rewrites on the GPU against the CPU backend: weight gradients folded into
// one matmul over all rows (fold-batch-matmul-sum) and reshapes that alias their operand instead of copying,
// including a view of a parameter read after the parameter's update (which must then not go in place).
#include <catch2/catch.hpp>

#include <cmath>
#include <random>

#include "gpu_test_support.h"
#include "ir/parser.h"
#include "runtime/cpu/cpu_backend.h"
#include "runtime/cuda/cuda_backend.h"

namespace tpc {

TEST_CASE("cuda memory: folded weight gradients and aliasing reshapes match the CPU backend", "[gpu]") {
  test::requireGpuOrSkip();
  auto g = parseGraph(R"(graph @wg(%x: f32[4,32,48], %dy: f32[4,32,40], %h: bf16[2,16,64], %dl: bf16[2,16,96])
    params(%w: f32[48,40] init=zeros) {
  %p = matmul(%x, %dy) {transpose_a=true} : f32[4,48,40]
  %dw = reduce_sum(%p) {axes=[0]} : f32[48,40]
  %q = matmul(%dl, %h) {transpose_a=true} : bf16[2,96,64]
  %dwte = reduce_sum(%q) {axes=[0]} : bf16[96,64]
  %xr = reshape(%x) {shape=[128,48]} : f32[128,48]
  %y = matmul(%xr, %w) : f32[128,40]
  %yr = reshape(%y) {shape=[4,32,40]} : f32[4,32,40]
  %s = add(%yr, %dy) : f32[4,32,40]
  %w2 = sub(%w, %dw) : f32[48,40]
  %wr = reshape(%w) {shape=[40,48]} : f32[40,48]
  %late = neg(%wr) : f32[40,48]
  return dwte=%dwte, s=%s, late=%late, w=%w2
})", "<test>");
  REQUIRE(g.ok());
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> u(-1, 1);
  auto random = [&](TensorType t) {
    HostTensor f(TensorType(DType::f32, t.shape));
    for (int64_t i = 0; i < f.numel(); ++i) f.data<float>()[i] = u(rng);
    return t.dtype == DType::f32 ? f : f.convertTo(t.dtype).convertTo(DType::f32);  // values bf16 can hold
  };
  TensorMap inputs, state;
  for (const Value* v : (*g)->inputs()) inputs[v->name()] = random(v->type());
  state["w"] = random((*g)->params()[0]->type());
  CpuOptions co;
  co.threads = 1;
  auto cpu = createCpuBackend(co);
  CudaOptions go;
  go.verbose = false;
  auto gpu = createCudaBackend({}, go);
  REQUIRE(cpu->prepare(**g, state).ok());
  Status s = gpu->prepare(**g, state);
  INFO((s.ok() ? std::string() : s.error()));
  REQUIRE(s.ok());
  // Two cuBLASLt calls for the folded gradients, one for %y, add, sub, neg and the copy of %w's update
  // (the old %w is read through %wr after it); the three reshapes and the two reduce_sums run nothing.
  CHECK(gpu->launchesPerStep() == 7);
  for (int step = 0; step < 2; ++step) {  // the second step starts from the updated %w
    auto ref = cpu->step(inputs, step);
    auto got = gpu->step(inputs, step);
    REQUIRE(ref.ok());
    INFO((got.ok() ? std::string() : got.error()));
    REQUIRE(got.ok());
    auto fw = cpu->readState("w"), gw = gpu->readState("w");
    REQUIRE(fw.ok());
    REQUIRE(gw.ok());
    (*ref)["w"] = *fw;
    (*got)["w"] = *gw;
    for (const auto& [name, r] : *ref) {
      INFO(name << " at step " << step);
      REQUIRE(got->count(name));
      const HostTensor& o = got->at(name);
      REQUIRE(o.shape() == r.shape());
      double worst = test::worstAbsError(o, r), scale = 0;
      for (int64_t i = 0; i < r.numel(); ++i) scale = std::max(scale, std::abs(r.getAsDouble(i)));
      // dwte is bf16: the CPU rounds each batch index's product before summing, the GPU only the sum.
      CHECK(worst <= (name == "dwte" ? 1.6e-2 : 1e-5) * scale);
    }
  }
}

}  // namespace tpc
