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
#include "gpu_test_support.h"
#include "models/gpt.h"
#include "passes/pipeline.h"
#include "runtime/cuda/cuda_backend.h"
#include "runtime/cuda/nvrtc_compiler.h"
#include "runtime/param_init.h"

using namespace tpc;
using namespace tpc::test;

namespace {

#define CUDA_OK(expr)                                                      \
  do {                                                                     \
    cudaError_t e_ = (expr);                                               \
    if (e_ != cudaSuccess) FAIL(#expr << ": " << cudaGetErrorString(e_)); \
  } while (0)

struct GpuDevice final : adamw::Device {
  cuda::NvrtcCompiler nvrtc;
  std::vector<void*> blocks;
  std::vector<cudaLibrary_t> libs;
  long long* step = nullptr;
  int* hold = nullptr;
  explicit GpuDevice(int sm) : nvrtc(sm) {
    CUDA_OK(cudaMalloc(reinterpret_cast<void**>(&step), 8));
    long long s = 3;
    CUDA_OK(cudaMemcpy(step, &s, 8, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMalloc(reinterpret_cast<void**>(&hold), 4));
  }
  ~GpuDevice() override {
    for (void* p : blocks) cudaFree(p);
    for (cudaLibrary_t l : libs) cudaLibraryUnload(l);
    cudaFree(step);
    cudaFree(hold);
  }
  char* alloc(size_t bytes) override {
    void* p = nullptr;
    CUDA_OK(cudaMalloc(&p, bytes));
    blocks.push_back(p);
    return static_cast<char*>(p);
  }
  void upload(char* dst, const void* src, size_t bytes) override {
    CUDA_OK(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice));
  }
  void download(void* dst, const char* src, size_t bytes) override {
    CUDA_OK(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost));
  }
  void launch(const cuda::KernelSpec& k, const std::vector<void*>& ops, const std::vector<void*>& res, int h) override {
    auto cubin = nvrtc.compile(k.source, k.entry);
    if (!cubin.ok()) FAIL(cubin.error());
    cudaLibrary_t lib;
    CUDA_OK(cudaLibraryLoadData(&lib, cubin->data(), nullptr, nullptr, 0, nullptr, nullptr, 0));
    libs.push_back(lib);
    cudaKernel_t kern;
    CUDA_OK(cudaLibraryGetKernel(&kern, lib, k.entry.c_str()));
    CUDA_OK(cudaMemcpy(hold, &h, 4, cudaMemcpyHostToDevice));
    kernels::ArgPack pack(k, ops, res, nullptr, 0, step, hold, [&](const std::vector<uint64_t>& a) -> void* {
      char* t = alloc(std::max<size_t>(a.size(), 1) * 8);
      upload(t, a.data(), a.size() * 8);
      return t;
    });
    CUDA_OK(cudaLaunchKernel(reinterpret_cast<const void*>(kern), dim3(k.grid.x, k.grid.y, k.grid.z),
                             dim3(k.block.x, k.block.y, k.block.z), pack.args.data(), k.sharedBytes, 0));
    CUDA_OK(cudaGetLastError());
    CUDA_OK(cudaDeviceSynchronize());
  }
};

TensorMap batch(int64_t i, float lr) {
  std::mt19937 rng(static_cast<unsigned>(i));
  TensorMap m;
  for (const char* name : {"tokens", "targets"}) {
    HostTensor t(TensorType(DType::i32, {2, 16}));
    for (int64_t k = 0; k < t.numel(); ++k) t.data<int32_t>()[k] = static_cast<int32_t>(rng() % 100);
    m[name] = t;
  }
  m["lr"] = HostTensor::scalarF32(lr);
  m["step"] = HostTensor::scalarF32(static_cast<float>(i));
  return m;
}

std::map<std::string, std::string> snapshot(const Backend& b, const Graph& step) {
  std::map<std::string, std::string> s;
  for (const Value* p : step.params()) {
    auto t = b.readState(p->name());
    REQUIRE(t.ok());
    s[p->name()] = std::string(reinterpret_cast<const char*>(t->raw()), t->bytes());
  }
  return s;
}

}  // namespace

TEST_CASE("cuda adamw: the multi-tensor kernel gives the per-tensor kernels' bits; a gated step changes nothing",
          "[gpu][adamw]") {
  requireGpuOrSkip();
  cudaDeviceProp prop{};
  CUDA_OK(cudaGetDeviceProperties(&prop, 0));
  GpuDevice d(prop.major * 10 + prop.minor);
  CHECK(adamw::checkAdamWGroups(d, {1, 2, 3, 4, 5, 17, 255, 768, 4096, 4097, 9001, 2304 * 768, (1 << 20) + 3}, 20, 100000) > 0);
}

TEST_CASE("cuda adamw: training steps with the multi-tensor kernel give the per-tensor state bit for bit; a NaN step "
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
    after.push_back(snapshot(b, *step));
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
  auto before = snapshot(b, *step);
  auto out = b.step(batch(4, 1e-2f), 4);
  REQUIRE(out.ok());
  CHECK(isNonFiniteStep(*out));
  CHECK(snapshot(b, *step) == before);
}
