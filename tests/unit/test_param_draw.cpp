// Parameters drawn on the GPU (runtime/cuda/param_draw.h): the draw kernel compiles with NVRTC and, under the
// CPU emulator, writes the same bits as initParam's host draw (deferred tensors, HostTensor::deferred).
#ifdef TPC_HAVE_CUDA
#include <catch2/catch.hpp>

#include <cstring>
#include <vector>

#include "cuda_emulator.h"
#include "ir/graph.h"
#include "runtime/cuda/nvrtc_compiler.h"
#include "runtime/cuda/param_draw.h"
#include "runtime/param_init.h"
#include "test_support.h"

using namespace tpc;
using namespace tpc::test;

TEST_CASE("param draw: the GPU kernel gives initParam's bits (NVRTC for sm_90, run by the CPU emulator)", "[cuda]") {
  Graph g("init");
  // 3000 elements over 4 blocks of 256 threads: the grid-stride loop takes every element three times round.
  Value* w = g.addParam("h.3.attn.c_proj.weight", TensorType(DType::f32, {3, 1000}), InitSpec{"normal", {0.02 / 3.0}});
  HostTensor host = initParam(*w, 4321);
  const HostTensor::NormalDraw* draw = host.pendingNormalDraw();
  REQUIRE(draw != nullptr);
  const HostTensor::NormalDraw d = *draw;
  CHECK(d.scale == static_cast<float>(0.02 / 3.0));
  cuda::KernelSpec k = cuda::normalDrawKernel(host.numel(), d.key, d.scale, 4);
  CHECK(k.grid.x == 4);
  CHECK(k.block.x == 256);
  TempDir dir;
  cuda::NvrtcCompiler nvrtc(90, dir.path.string());
  auto cubin = nvrtc.compile(k.source, k.entry);
  if (!cubin.ok()) FAIL(cubin.error());
  auto launch = compileEmulated(k.source, k.entry, dir.path.string(), 0);
  if (!launch.ok()) FAIL(launch.error());
  std::vector<float> out(static_cast<size_t>(host.numel()) + 1, -1.f);  // one past the end stays untouched
  void* outPtr = out.data();
  long long n = host.numel(), key = static_cast<long long>(d.key);
  float scale = d.scale;
  void* args[] = {&outPtr, &n, &key, &scale};
  (*launch)(args, k.grid.x, 1, 1, k.block.x, 1, 1, 0);
  CHECK(host.pendingNormalDraw() != nullptr);  // nothing read the host copy yet
  const float* want = std::as_const(host).data<float>();
  CHECK(host.pendingNormalDraw() == nullptr);
  size_t differ = 0;
  for (int64_t i = 0; i < host.numel(); ++i) differ += std::memcmp(&out[i], &want[i], 4) != 0;
  CHECK(differ == 0);
  CHECK(out.back() == -1.f);
}
#endif  // TPC_HAVE_CUDA
