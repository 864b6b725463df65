// cuDNN's fused attention (runtime/cuda/cudnn_attention.h) on every "tc" attention case of
// tests/unit/cuda_kernel_cases.h it takes (plain and packed layouts, causal, head_dim 64 and 128, T 77 to
// 1024): planned, bound to device buffers that start as NaN bytes, run, and compared with the CPU backend
// in the kernel tests' metric, to the tolerance of our own kernels with one 16-bit P (tcAttentionTol).
#include <cuda_runtime.h>

#include <catch2/catch.hpp>

#include <cstring>

#include "cuda_kernel_cases.h"
#include "gpu_test_support.h"
#include "runtime/cuda/cudnn_attention.h"

using namespace tpc;
using namespace tpc::test;
using namespace tpc::test::kernels;

namespace {

#define CUDA_OK(expr)                                                      \
  do {                                                                     \
    cudaError_t e_ = (expr);                                               \
    if (e_ != cudaSuccess) FAIL(#expr << ": " << cudaGetErrorString(e_)); \
  } while (0)

std::vector<HostTensor> runCudnn(cuda::CudnnAttention& att, int plan, OneOp& o, const std::vector<HostTensor>& inputs) {
  std::vector<void*> ops, res;
  for (const HostTensor& t : inputs) {
    void* p = nullptr;
    CUDA_OK(cudaMalloc(&p, std::max<size_t>(t.bytes(), 1)));
    CUDA_OK(cudaMemcpy(p, t.raw(), t.bytes(), cudaMemcpyHostToDevice));
    ops.push_back(p);
  }
  for (const Value* r : o.node->results()) {
    void* p = nullptr;
    size_t bytes = static_cast<size_t>(r->type().bytes());
    CUDA_OK(cudaMalloc(&p, bytes));
    CUDA_OK(cudaMemset(p, 0xff, bytes));
    res.push_back(p);
  }
  void* ws = nullptr;
  size_t wsBytes = static_cast<size_t>(std::max<int64_t>(att.workspaceBytes(plan), 1));
  CUDA_OK(cudaMalloc(&ws, wsBytes));
  CUDA_OK(cudaMemset(ws, 0xff, wsBytes));
  auto b = att.bind(plan, ops, res, ws);
  if (!b.ok()) FAIL(b.error());
  auto ran = att.run(*b, nullptr);
  if (!ran.ok()) FAIL(ran.error());
  CUDA_OK(cudaDeviceSynchronize());
  std::vector<HostTensor> out;
  for (size_t r = 0; r < res.size(); ++r) {
    HostTensor t(o.node->result(r)->type());
    CUDA_OK(cudaMemcpy(t.raw(), res[r], t.bytes(), cudaMemcpyDeviceToHost));
    out.push_back(t);
  }
  for (void* p : ops) cudaFree(p);
  for (void* p : res) cudaFree(p);
  cudaFree(ws);
  return out;
}

}  // namespace

TEST_CASE("cudnn attention: every attention case cuDNN takes matches the CPU backend", "[gpu]") {
  requireGpuOrSkip();
  auto att = cuda::CudnnAttention::create();
  if (!att.ok()) FAIL(att.error());
  int compared = 0, taken = 0;
  for (const Case& c : allCases()) {
    if (!isTcAttentionCase(c)) continue;
    OneOp o = oneOp(c.op, c.types, c.attrs);
    if (!cuda::cudnnAttentionTakes(*o.node)) continue;
    INFO(c.name);
    ++taken;
    auto plan = (*att)->plan(*o.node);
    if (!plan.ok()) FAIL(plan.error());
    CHECK((*att)->plan(*o.node).value() == *plan);  // one plan per distinct shape
    std::mt19937 rng(std::hash<std::string>{}(c.name) & 0xffffffff);
    std::vector<HostTensor> in = c.make(rng);
    std::vector<HostTensor> want = runCpu(c, in, 4242, 7);
    std::vector<HostTensor> got = runCudnn(**att, *plan, o, in);
    compared += compareResults(o, got, want, tcAttentionTol(c, cuda::TcAttnOptions{}));
    // Deterministic: a second run gives the same bits.
    std::vector<HostTensor> again = runCudnn(**att, *plan, o, in);
    for (size_t r = 0; r < got.size(); ++r) CHECK(std::memcmp(got[r].raw(), again[r].raw(), got[r].bytes()) == 0);
  }
  INFO((*att)->version());
  // The causal cases without dropout, forward and backward, plain and packed.
  CHECK(taken >= 8);
  CHECK(compared >= 2 * taken);
}
