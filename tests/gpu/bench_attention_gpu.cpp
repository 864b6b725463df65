// Hidden benchmark (`tpc_gpu_tests "[.bench]"`): causal bf16 flash attention, forward and backward, timed
// with CUDA events at the GPT shapes: the f32 CUDA-core kernels and the tensor-core ones in variants of
// cuda::TcAttnOptions (the first kernels without cp.async and ldmatrix; the narrow 16-row warps that shipped
// before wideWarps, alone and with the fused scale and lazy rescale; wide warps without each of those and with
// each walked tile size; as shipped; shipped without the hi+lo split of P). Prints ms, TFLOP/s (causal FLOPs:
// forward 2 B H T^2 Dh, backward 2.5 times that), the speed-up over the narrow kernels, and how far each
// variant's results are from the CUDA-core kernels' (max |new - old| / max |old| per result).
#include <cuda_runtime.h>

#include <catch2/catch.hpp>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>

#include "cuda_kernel_cases.h"
#include "gpu_test_support.h"
#include "runtime/cuda/kernels/attention.h"
#include "runtime/cuda/nvrtc_compiler.h"

using namespace tpc;
using namespace tpc::test;
using namespace tpc::test::kernels;

namespace {

struct Launchable {
  cudaKernel_t fn;
  KernelSpec spec;
};

std::vector<Launchable> load(cuda::NvrtcCompiler& nvrtc, const NodeLowering& low) {
  std::vector<Launchable> out;
  for (const KernelSpec& k : low.kernels) {
    auto cubin = nvrtc.compile(k.source, k.entry);
    if (!cubin.ok()) FAIL(cubin.error());
    cudaLibrary_t lib;
    CUDA_OK(cudaLibraryLoadData(&lib, cubin->data(), nullptr, nullptr, 0, nullptr, nullptr, 0));
    cudaKernel_t fn;
    CUDA_OK(cudaLibraryGetKernel(&fn, lib, k.entry.c_str()));
    if (k.sharedBytes > 48 * 1024)
      CUDA_OK(cudaFuncSetAttribute(reinterpret_cast<const void*>(fn), cudaFuncAttributeMaxDynamicSharedMemorySize,
                                      static_cast<int>(k.sharedBytes)));
    out.push_back({fn, k});
  }
  return out;
}

void launchAll(const std::vector<Launchable>& ks, const std::vector<void*>& ops, const std::vector<void*>& res, char* ws,
               void* step) {
  for (const Launchable& l : ks) {
    ArgPack pack(l.spec, ops, res, ws, 4242, step);
    const KernelSpec& k = l.spec;
    CUDA_OK(cudaLaunchKernel(reinterpret_cast<const void*>(l.fn), dim3(k.grid.x, k.grid.y, k.grid.z),
                                dim3(k.block.x, k.block.y, k.block.z), pack.args.data(), k.sharedBytes, 0));
  }
  CUDA_OK(cudaGetLastError());
}

// Milliseconds per run of all of `ks` (2 warm-up runs, then the mean of `iters`).
double timeMs(const std::vector<Launchable>& ks, const std::vector<void*>& ops, const std::vector<void*>& res, char* ws,
              void* step, int iters = 10) {
  for (int i = 0; i < 2; ++i) launchAll(ks, ops, res, ws, step);
  cudaEvent_t a, b;
  CUDA_OK(cudaEventCreate(&a));
  CUDA_OK(cudaEventCreate(&b));
  CUDA_OK(cudaEventRecord(a));
  for (int i = 0; i < iters; ++i) launchAll(ks, ops, res, ws, step);
  CUDA_OK(cudaEventRecord(b));
  CUDA_OK(cudaEventSynchronize(b));
  float ms = 0;
  CUDA_OK(cudaEventElapsedTime(&ms, a, b));
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return ms / iters;
}

void* deviceBf16(size_t n, std::mt19937& rng) {
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  std::vector<uint16_t> h(n);
  for (uint16_t& x : h) {
    float f = u(rng);
    uint32_t bits;
    std::memcpy(&bits, &f, 4);
    x = static_cast<uint16_t>(bits >> 16);
  }
  void* p = nullptr;
  CUDA_OK(cudaMalloc(&p, n * 2));
  CUDA_OK(cudaMemcpy(p, h.data(), n * 2, cudaMemcpyHostToDevice));
  return p;
}

// max |a - b| / max |a| of two device bf16 arrays of n values.
double relDiff(const void* a, const void* b, size_t n) {
  std::vector<uint16_t> ha(n), hb(n);
  cudaMemcpy(ha.data(), a, n * 2, cudaMemcpyDeviceToHost);
  cudaMemcpy(hb.data(), b, n * 2, cudaMemcpyDeviceToHost);
  auto f = [](uint16_t x) {
    uint32_t bits = uint32_t(x) << 16;
    float v;
    std::memcpy(&v, &bits, 4);
    return double(v);
  };
  double diff = 0, mag = 0;
  for (size_t i = 0; i < n; ++i) {
    diff = test::worseOf(diff, test::absError(f(ha[i]), f(hb[i])));
    mag = std::max(mag, std::abs(f(ha[i])));
  }
  return diff / std::max(mag, 1e-30);
}

}  // namespace

TEST_CASE("bench: causal bf16 flash attention, CUDA cores vs tensor cores", "[.bench]") {
  requireGpuOrSkip();
  cudaDeviceProp prop{};
  CUDA_OK(cudaGetDeviceProperties(&prop, 0));
  cuda::NvrtcCompiler nvrtc(prop.major * 10 + prop.minor);
  cuda::LoweringContext ctx;
  ctx.smMajor = prop.major;
  ctx.smMinor = prop.minor;
  ctx.maxSharedBytes = static_cast<int64_t>(prop.sharedMemPerBlockOptin);
  std::printf("%-26s %-5s %-16s %9s %9s %9s\n", "shape [B,H,T,Dh]", "pass", "kernels", "ms", "TFLOP/s", "vs narrow");
  struct Variant {
    const char* name;
    bool tensorCore;
    cuda::TcAttnOptions opt;
  };
  using O = cuda::TcAttnOptions;
  auto with = [](O o, auto&& edit) {
    edit(o);
    return o;
  };
  const Variant variants[] = {
      {"cuda-core", false, {}},
      {"tc-main", true, with(O::narrow(), [](O& o) { o.asyncCopy = o.ldmatrix = false; })},
      {"tc-narrow", true, O::narrow()},  // the default before wideWarps and fusedScale
      {"tc-narrow-fl", true, with(O::narrow(), [](O& o) { o.fusedScale = o.lazyRescale = true; })},
      {"tc-wide-unfused", true, with(O{}, [](O& o) { o.fusedScale = false, o.wideBackward = true; })},
      {"tc-wide-eager", true, with(O{}, [](O& o) { o.lazyRescale = false, o.wideBackward = true; })},
      {"tc-wide-walk16", true, with(O{}, [](O& o) { o.walkRows = 16, o.wideBackward = true; })},
      {"tc-wide-walk32", true, with(O{}, [](O& o) { o.walkRows = 32, o.wideBackward = true; })},
      {"tc-wide-walk64", true, with(O{}, [](O& o) { o.walkRows = 64, o.wideBackward = true; })},
      {"tc-wide-all", true, with(O{}, [](O& o) { o.wideBackward = true; })},  // wide backward too
      {"tc-shipped", true, {}},
      {"tc-split-P", true, with(O{}, [](O& o) { o.splitP = true; })},  // P as a hi + lo pair (TPC_TC_ATTENTION=split)
  };
  constexpr int kVariants = sizeof(variants) / sizeof(variants[0]), kNarrow = 2;
  const int64_t shapes[2][4] = {{16, 12, 1024, 64}, {8, 16, 1024, 128}};
  for (const auto& d : shapes) {
    const Shape s = {d[0], d[1], d[2], d[3]};
    const size_t n = static_cast<size_t>(s[0] * s[1] * s[2] * s[3]), rows = static_cast<size_t>(s[0] * s[1] * s[2]);
    TensorType t(DType::bf16, s), lse(DType::f32, {s[0], s[1], s[2]});
    OneOp fwd = oneOp(OpKind::Attention, {t, t, t}, attrs({{"causal", true}}));
    OneOp bwd = oneOp(OpKind::AttentionGrad, {t, t, t, t, t, lse}, attrs({{"causal", true}}));
    std::mt19937 rng(11);
    void *q = deviceBf16(n, rng), *k = deviceBf16(n, rng), *v = deviceBf16(n, rng), *dO = deviceBf16(n, rng);
    void* stepDev = nullptr;
    CUDA_OK(cudaMalloc(&stepDev, 8));
    CUDA_OK(cudaMemset(stepDev, 0, 8));
    const double fwdFlop = 2.0 * s[0] * s[1] * s[2] * s[2] * s[3], bwdFlop = 2.5 * fwdFlop;
    std::vector<void*> outs[kVariants], lses[kVariants], grads[kVariants];
    double fwdMs[kVariants], bwdMs[kVariants];
    for (int impl = 0; impl < kVariants; ++impl) {
      const Variant& var = variants[impl];
      auto fl = var.tensorCore ? cuda::lowerAttentionTensorCore(*fwd.node, ctx, var.opt) : cuda::lowerAttentionSimt(*fwd.node, ctx);
      auto bl = var.tensorCore ? cuda::lowerAttentionGradTensorCore(*bwd.node, ctx, var.opt)
                               : cuda::lowerAttentionGradSimt(*bwd.node, ctx);
      REQUIRE(fl.ok());
      REQUIRE(bl.ok());
      void *o = nullptr, *l = nullptr;
      CUDA_OK(cudaMalloc(&o, n * 2));
      CUDA_OK(cudaMalloc(&l, rows * 4));
      outs[impl] = {o};
      lses[impl] = {l};
      fwdMs[impl] = timeMs(load(nvrtc, *fl), {q, k, v}, {o, l}, nullptr, stepDev);
      std::vector<void*> g(3);
      for (void*& p : g) CUDA_OK(cudaMalloc(&p, n * 2));
      grads[impl] = g;
      char* ws = nullptr;
      CUDA_OK(cudaMalloc(reinterpret_cast<void**>(&ws), static_cast<size_t>(std::max<int64_t>(bl->workspaceBytes, 1))));
      // Each backward takes its own forward's out and lse.
      std::vector<void*> ops = {dO, q, k, v, o, l};
      bwdMs[impl] = timeMs(load(nvrtc, *bl), ops, g, ws, stepDev);
      cudaFree(ws);
    }
    for (int pass = 0; pass < 2; ++pass)
      for (int impl = 0; impl < kVariants; ++impl) {
        const double ms = pass ? bwdMs[impl] : fwdMs[impl], main = pass ? bwdMs[kNarrow] : fwdMs[kNarrow];
        std::printf("%-26s %-5s %-16s %9.3f %9.1f %8.2fx\n", shapeStr(s).c_str(), pass ? "bwd" : "fwd",
                    variants[impl].name, ms, (pass ? bwdFlop : fwdFlop) / ms / 1e9, main / ms);
      }
    CUDA_OK(cudaDeviceSynchronize());
    for (int impl = 1; impl < kVariants; ++impl) {
      std::printf("%-26s %-16s vs cuda-core: out %.2e, dq %.2e, dk %.2e, dv %.2e (max |diff| / max |old|)\n",
                  shapeStr(s).c_str(), variants[impl].name, relDiff(outs[0][0], outs[impl][0], n),
                  relDiff(grads[0][0], grads[impl][0], n), relDiff(grads[0][1], grads[impl][1], n),
                  relDiff(grads[0][2], grads[impl][2], n));
      CHECK(relDiff(outs[0][0], outs[impl][0], n) < 2e-2);
      for (int r = 0; r < 3; ++r) CHECK(relDiff(grads[0][r], grads[impl][r], n) < 5e-2);
    }
    for (int impl = 0; impl < kVariants; ++impl) {
      cudaFree(outs[impl][0]);
      cudaFree(lses[impl][0]);
      for (void* p : grads[impl]) cudaFree(p);
    }
    for (void* p : {q, k, v, dO, stepDev}) cudaFree(p);
  }
}

// The GPT's own layout (attention_qkv on the packed [B, T, 3, H, Dh] projection, out and dout [B, T, H, Dh]):
// the narrow tensor-core kernels (the default before wideWarps) against the shipped ones at GPT-2 small's shape.
TEST_CASE("bench: causal bf16 attention_qkv on the packed projection, narrow vs shipped tensor-core kernels",
          "[.bench]") {
  requireGpuOrSkip();
  cudaDeviceProp prop{};
  CUDA_OK(cudaGetDeviceProperties(&prop, 0));
  cuda::NvrtcCompiler nvrtc(prop.major * 10 + prop.minor);
  cuda::LoweringContext ctx;
  ctx.maxSharedBytes = static_cast<int64_t>(prop.sharedMemPerBlockOptin);
  const int64_t B = 16, T = 1024, H = 12, D = 64;
  const std::vector<int64_t> perm{2, 0, 3, 1, 4};
  const Shape qkvShape = packedShape(B, T, H, D, perm);
  const TensorType xt(DType::bf16, qkvShape), ot(DType::bf16, {B, T, H, D}), lt(DType::f32, {B, H, T});
  AttrDict a = attrs({{"causal", true}});
  a.set("perm", perm);
  OneOp fwd = oneOp(OpKind::AttentionQkv, {xt}, a);
  OneOp bwd = oneOp(OpKind::AttentionQkvGrad, {ot, xt, ot, lt}, a);
  const size_t n = static_cast<size_t>(B * T * H * D);
  std::mt19937 rng(12);
  void *x = deviceBf16(3 * n, rng), *dO = deviceBf16(n, rng), *stepDev = nullptr;
  CUDA_OK(cudaMalloc(&stepDev, 8));
  CUDA_OK(cudaMemset(stepDev, 0, 8));
  const double fwdFlop = 2.0 * B * H * T * T * D, bwdFlop = 2.5 * fwdFlop;
  const cuda::TcAttnOptions variants[2] = {cuda::TcAttnOptions::narrow(), {}};
  void *outs[2], *dx[2];
  for (int impl = 0; impl < 2; ++impl) {
    auto fl = cuda::lowerAttentionTensorCore(*fwd.node, ctx, variants[impl]);
    auto bl = cuda::lowerAttentionGradTensorCore(*bwd.node, ctx, variants[impl]);
    REQUIRE(fl.ok());
    REQUIRE(bl.ok());
    void* l = nullptr;
    char* ws = nullptr;
    CUDA_OK(cudaMalloc(&outs[impl], n * 2));
    CUDA_OK(cudaMalloc(&l, n / D * 4));
    CUDA_OK(cudaMalloc(&dx[impl], 3 * n * 2));
    CUDA_OK(cudaMalloc(reinterpret_cast<void**>(&ws), static_cast<size_t>(std::max<int64_t>(bl->workspaceBytes, 1))));
    const double f = timeMs(load(nvrtc, *fl), {x}, {outs[impl], l}, nullptr, stepDev);
    const double b = timeMs(load(nvrtc, *bl), {dO, x, outs[impl], l}, {dx[impl]}, ws, stepDev);
    std::printf("attention_qkv [16,1024,3,12,64] %-10s fwd %7.3f ms (%5.1f TFLOP/s)  bwd %7.3f ms (%5.1f TFLOP/s)\n",
                impl ? "tc-shipped" : "tc-narrow", f, fwdFlop / f / 1e9, b, bwdFlop / b / 1e9);
    cudaFree(l);
    cudaFree(ws);
  }
  CUDA_OK(cudaDeviceSynchronize());
  std::printf("attention_qkv tc-shipped vs tc-narrow: out %.2e, dqkv %.2e (max |diff| / max |old|)\n",
              relDiff(outs[0], outs[1], n), relDiff(dx[0], dx[1], 3 * n));
  CHECK(relDiff(outs[0], outs[1], n) < 2e-2);
  CHECK(relDiff(dx[0], dx[1], 3 * n) < 5e-2);
  for (void* p : {outs[0], outs[1], dx[0], dx[1], x, dO, stepDev}) cudaFree(p);
}
