// The CUDA kernel families (runtime/cuda/kernels) on the GPU, kernel by kernel: each case of
// tests/unit/cuda_kernel_cases.h is lowered, compiled with NVRTC for this GPU, launched directly (no
// executor) and compared with the CPU backend: f32 results within 1e-5 relative, bf16/f16 within 1e-2.
// Results start as NaN bytes (and workspaces that need not be zeroed as 0xff), so that an element a
// kernel never writes, or a read of scratch it never wrote, fails. Each case runs twice: same bits.
#include <cuda_runtime.h>

#include <catch2/catch.hpp>

#include <cstring>

#include "cuda_kernel_cases.h"
#include "gpu_test_support.h"
#include "runtime/cuda/nvrtc_compiler.h"

using namespace tpc;
using namespace tpc::test;
using namespace tpc::test::kernels;

namespace {

#define CUDA_OK(expr)                                                      \
  do {                                                                     \
    cudaError_t e_ = (expr);                                               \
    if (e_ != cudaSuccess) FAIL(#expr << ": " << cudaGetErrorString(e_)); \
  } while (0)

std::vector<HostTensor> runGpu(cuda::NvrtcCompiler& nvrtc, OneOp& o, const NodeLowering& low,
                               const std::vector<HostTensor>& inputs, uint64_t seed, int64_t step) {
  std::vector<void*> ops, res;
  for (const HostTensor& t : inputs) {
    void* p = nullptr;
    CUDA_OK(cudaMalloc(&p, std::max<size_t>(t.bytes(), 1)));
    if (t.bytes()) CUDA_OK(cudaMemcpy(p, t.raw(), t.bytes(), cudaMemcpyHostToDevice));
    ops.push_back(p);
  }
  for (const Value* r : o.node->results()) {
    void* p = nullptr;
    size_t bytes = std::max<size_t>(static_cast<size_t>(r->type().bytes()), 1);
    CUDA_OK(cudaMalloc(&p, bytes));
    CUDA_OK(cudaMemset(p, 0xff, bytes));
    res.push_back(p);
  }
  char* ws = nullptr;
  size_t wsBytes = static_cast<size_t>(std::max<int64_t>(low.workspaceBytes, 1));
  CUDA_OK(cudaMalloc(reinterpret_cast<void**>(&ws), wsBytes));
  CUDA_OK(cudaMemset(ws, low.zeroWorkspace ? 0 : 0xff, wsBytes));
  long long* stepDev = nullptr;
  long long stepHost = step;
  CUDA_OK(cudaMalloc(reinterpret_cast<void**>(&stepDev), 8));
  CUDA_OK(cudaMemcpy(stepDev, &stepHost, 8, cudaMemcpyHostToDevice));
  std::vector<cudaLibrary_t> libs;
  for (const KernelSpec& k : low.kernels) {
    INFO(k.entry);
    auto cubin = nvrtc.compile(k.source, k.entry);
    if (!cubin.ok()) FAIL(cubin.error());
    cudaLibrary_t lib;
    CUDA_OK(cudaLibraryLoadData(&lib, cubin->data(), nullptr, nullptr, 0, nullptr, nullptr, 0));
    libs.push_back(lib);
    cudaKernel_t kern;
    CUDA_OK(cudaLibraryGetKernel(&kern, lib, k.entry.c_str()));
    if (k.sharedBytes > 48 * 1024)
      CUDA_OK(cudaFuncSetAttribute(reinterpret_cast<const void*>(kern), cudaFuncAttributeMaxDynamicSharedMemorySize,
                                   static_cast<int>(k.sharedBytes)));
    ArgPack pack(k, ops, res, ws, seed, stepDev);
    CUDA_OK(cudaLaunchKernel(reinterpret_cast<const void*>(kern), dim3(k.grid.x, k.grid.y, k.grid.z),
                             dim3(k.block.x, k.block.y, k.block.z), pack.args.data(), k.sharedBytes, 0));
    CUDA_OK(cudaGetLastError());
    CUDA_OK(cudaDeviceSynchronize());
  }
  std::vector<HostTensor> out;
  for (size_t r = 0; r < res.size(); ++r) {
    HostTensor t(o.node->result(r)->type());
    if (t.bytes()) CUDA_OK(cudaMemcpy(t.raw(), res[r], t.bytes(), cudaMemcpyDeviceToHost));
    out.push_back(t);
  }
  for (void* p : ops) cudaFree(p);
  for (void* p : res) cudaFree(p);
  cudaFree(ws);
  cudaFree(stepDev);
  for (cudaLibrary_t l : libs) cudaLibraryUnload(l);
  return out;
}

}  // namespace

TEST_CASE("cuda kernels: every family kernel matches the CPU backend (f32 1e-5 and bf16 or f16 1e-2)", "[gpu]") {
  requireGpuOrSkip();
  cudaDeviceProp prop{};
  CUDA_OK(cudaGetDeviceProperties(&prop, 0));
  cuda::NvrtcCompiler nvrtc(prop.major * 10 + prop.minor);
  int compared = 0;
  for (const Case& c : allCases()) {
    INFO(c.name);
    std::mt19937 rng(std::hash<std::string>{}(c.name) & 0xffffffff);
    std::vector<HostTensor> in = c.make(rng);
    OneOp o = oneOp(c.op, c.types, c.attrs);
    auto low = lowerCase(c, o);
    REQUIRE(low.ok());
    const uint64_t seed = 4242;
    const int64_t step = 7;
    std::vector<HostTensor> want = runCpu(c, in, seed, step);
    std::vector<HostTensor> got = runGpu(nvrtc, o, *low, in, seed, step);
    compared += compareResults(o, got, want);
    // Deterministic: a second run gives the same bits (no float atomics anywhere).
    std::vector<HostTensor> again = runGpu(nvrtc, o, *low, in, seed, step);
    for (size_t r = 0; r < got.size(); ++r) CHECK(std::memcmp(got[r].raw(), again[r].raw(), got[r].bytes()) == 0);
  }
  CHECK(compared > 60);
}
