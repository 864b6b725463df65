// The CUDA kernel families (runtime/cuda/kernels) on the GPU, kernel by kernel: each case of
// tests/unit/cuda_kernel_cases.h is lowered, compiled with NVRTC for this GPU, launched directly (no
// executor) and compared with the CPU backend: f32 results within 1e-5 relative, bf16/f16 within 1e-2.
// Results start as NaN bytes (and workspaces that need not be zeroed as 0xff), so that an element a
// kernel never writes, or a read of scratch it never wrote, fails. Each case runs twice: same bits.
#include <cuda_runtime.h>

#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>

#include "cuda_kernel_cases.h"
#include "gpu_test_support.h"
#include "ir/shape_rules.h"
#include "runtime/cuda/nvrtc_compiler.h"

using namespace tpc;
using namespace tpc::test;
using namespace tpc::test::kernels;

namespace {

// inPlace: the op's in-place result (OpInfo::inPlaceResult) is written over its operand's buffer.
std::vector<HostTensor> runGpu(cuda::NvrtcCompiler& nvrtc, OneOp& o, const NodeLowering& low,
                               const std::vector<HostTensor>& inputs, uint64_t seed, int64_t step, bool inPlace = false) {
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
  const int inRes = inPlace ? o.node->info().inPlaceResult : -1;
  if (inRes >= 0) {
    cudaFree(res[inRes]);
    res[inRes] = ops[o.node->info().inPlaceOperand];
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
  for (size_t r = 0; r < res.size(); ++r)
    if (static_cast<int>(r) != inRes) cudaFree(res[r]);
  cudaFree(ws);
  cudaFree(stepDev);
  for (cudaLibrary_t l : libs) cudaLibraryUnload(l);
  return out;
}

// GPU 0's compute capability as NVRTC takes it (90 for sm_90); the test is skipped without a GPU.
int gpuArch() {
  requireGpuOrSkip();
  cudaDeviceProp prop{};
  CUDA_OK(cudaGetDeviceProperties(&prop, 0));
  return prop.major * 10 + prop.minor;
}

// A case's inputs, drawn by a generator seeded with its name: the same inputs in every test.
std::vector<HostTensor> caseInputs(const Case& c) {
  std::mt19937 rng(std::hash<std::string>{}(c.name) & 0xffffffff);
  return c.make(rng);
}

}  // namespace

TEST_CASE("cuda kernels: every family kernel matches the CPU backend (f32 1e-5 and bf16 or f16 1e-2 or 4e-2 for 16-bit-P attention)", "[gpu]") {
  cuda::NvrtcCompiler nvrtc(gpuArch());
  int compared = 0;
  for (const Case& c : allCases()) {
    INFO(c.name);
    std::vector<HostTensor> in = caseInputs(c);
    OneOp o = oneOp(c.op, c.types, c.attrs);
    auto low = lowerCase(c, o);
    REQUIRE(low.ok());
    const uint64_t seed = 4242;
    const int64_t step = 7;
    std::vector<HostTensor> want = runCpu(c, in, seed, step);
    std::vector<HostTensor> got = runGpu(nvrtc, o, *low, in, seed, step);
    compared += compareResults(o, got, want, tcAttentionTol(c, cuda::TcAttnOptions{}));
    // Deterministic: a second run gives the same bits (no float atomics anywhere).
    std::vector<HostTensor> again = runGpu(nvrtc, o, *low, in, seed, step);
    for (size_t r = 0; r < got.size(); ++r) CHECK(std::memcmp(got[r].raw(), again[r].raw(), got[r].bytes()) == 0);
  }
  CHECK(compared > 60);
}

// layer_norm_grad and embedding_grad: the kernels the faster ones replaced (TPC_MEMBW_OFF=lngrad2,embgrad2,
// oldMembwKernels) still match the CPU backend, and the new ones give their bits where they should
// (oldBitsExpected: dx; the table rows of at most 32 positions).
TEST_CASE("cuda kernels: the old layer_norm_grad and embedding_grad kernels match the CPU and the new ones give their bits", "[gpu]") {
  cuda::NvrtcCompiler nvrtc(gpuArch());
  int compared = 0, sameBits = 0;
  for (const Case& c : allCases()) {
    if (!hasOldVariant(c)) continue;
    INFO(c.name);
    std::vector<HostTensor> in = caseInputs(c);
    OneOp o = oneOp(c.op, c.types, c.attrs);
    auto low = lowerCase(c, o), old = lowerCase(c, o, oldMembwKernels());
    REQUIRE(low.ok());
    REQUIRE(old.ok());
    std::vector<HostTensor> want = runCpu(c, in, 4242, 7);
    std::vector<HostTensor> gotOld = runGpu(nvrtc, o, *old, in, 4242, 7);
    compared += compareResults(o, gotOld, want);
    std::vector<HostTensor> gotNew = runGpu(nvrtc, o, *low, in, 4242, 7);
    sameBits += checkOldBits(*o.node, in, gotNew, gotOld);
  }
  CHECK(compared > 20);
  CHECK(sameBits > 100);
}

// layer_norm with a residual: its sum s has the bits of the CPU backend's add (an f32 add rounded to s's dtype),
// exactly, not within the family test's tolerance.
TEST_CASE("cuda kernels: layer_norm's residual sum has the add's bits", "[gpu]") {
  cuda::NvrtcCompiler nvrtc(gpuArch());
  int compared = 0;
  for (const Case& c : allCases()) {
    if (c.op != OpKind::LayerNorm || c.types.size() != 4) continue;
    INFO(c.name);
    std::vector<HostTensor> in = caseInputs(c);
    OneOp o = oneOp(c.op, c.types, c.attrs);
    auto low = lowerCase(c, o);
    REQUIRE(low.ok());
    std::vector<HostTensor> want = runCpu(c, in, 4242, 7), got = runGpu(nvrtc, o, *low, in, 4242, 7);
    REQUIRE(want.size() == 2);
    REQUIRE(got.size() == 2);
    REQUIRE(got[1].numel() == want[1].numel());
    int64_t differ = 0;
    for (int64_t i = 0; i < got[1].numel(); ++i) differ += got[1].getAsDouble(i) != want[1].getAsDouble(i);
    CHECK(differ == 0);
    ++compared;
  }
  CHECK(compared >= 4);
}

// layer_norm_grad's rows through the cp.async ring (LoweringContext::layerNormGradStages): every result (dx,
// dgamma, dbeta and dx's sums) the bits of the register prefetch, which sums in the same order.
TEST_CASE("cuda kernels: layer_norm_grad's ring of rows gives the register prefetch's bits", "[gpu]") {
  cuda::NvrtcCompiler nvrtc(gpuArch());
  int compared = 0, allResults = 0;
  for (const Case& c : allCases()) {
    if (c.op != OpKind::LayerNormGrad || (c.ctx.layerNormGradStages == 0 && !c.ctx.layerNormGradWide)) continue;
    INFO(c.name);
    OneOp o = oneOp(c.op, c.types, c.attrs);
    auto l = ringAndRegisterLowerings(c, o);
    if (!l) continue;  // element loads or a width without the ring: no ring
    std::vector<HostTensor> in = caseInputs(c);
    allResults += checkRingBits(*l, runGpu(nvrtc, o, l->ring, in, 4242, 7), runGpu(nvrtc, o, l->regs, in, 4242, 7));
    ++compared;
  }
  CHECK(compared >= 8);
  CHECK(allResults >= 4);
}

// The kernels that may write a result over an operand (OpInfo::inPlaceResult: dlogits over the logits), doing
// so as the memory plan lets them when the operand is dead: the same bits as into a buffer of their own.
TEST_CASE("cuda kernels: in-place kernels give the same bits written over their operand", "[gpu]") {
  cuda::NvrtcCompiler nvrtc(gpuArch());
  int compared = 0;
  for (const Case& c : allCases()) {
    if (opInfo(c.op).inPlaceResult < 0) continue;
    INFO(c.name);
    std::vector<HostTensor> in = caseInputs(c);
    OneOp o = oneOp(c.op, c.types, c.attrs);
    auto low = lowerCase(c, o);
    REQUIRE(low.ok());
    std::vector<HostTensor> apart = runGpu(nvrtc, o, *low, in, 4242, 7);
    std::vector<HostTensor> over = runGpu(nvrtc, o, *low, in, 4242, 7, true);
    for (size_t r = 0; r < apart.size(); ++r) {
      CHECK(std::memcmp(apart[r].raw(), over[r].raw(), apart[r].bytes()) == 0);
      ++compared;
    }
  }
  CHECK(compared >= 20);
}

// The tensor-core attention variants that do not ship (cuda::TcAttnOptions, timed by the "[.bench]" test)
// on every "tc" case of cuda_kernel_cases.h (plain and packed layouts, causal and full, dropout, T 77,
// head_dim 64 and 128), against the CPU backend like the shipped kernels above, and deterministic.
TEST_CASE("cuda kernels: every tensor-core attention variant matches the CPU backend", "[gpu]") {
  cuda::NvrtcCompiler nvrtc(gpuArch());
  int compared = 0;
  for (const TcVariant& v : tcAttentionVariants())
    for (const Case& c : allCases()) {
      if (!isTcAttentionCase(c)) continue;
      INFO(v.name << ": " << c.name);
      std::vector<HostTensor> in = caseInputs(c);
      OneOp o = oneOp(c.op, c.types, c.attrs);
      auto low = lowerTcVariant(o, v.opt);
      REQUIRE(low.ok());
      const uint64_t seed = 4242;
      const int64_t step = 7;
      std::vector<HostTensor> want = runCpu(c, in, seed, step);
      std::vector<HostTensor> got = runGpu(nvrtc, o, *low, in, seed, step);
      compared += compareResults(o, got, want, tcAttentionTol(c, v.opt));
      std::vector<HostTensor> again = runGpu(nvrtc, o, *low, in, seed, step);
      for (size_t r = 0; r < got.size(); ++r) CHECK(std::memcmp(got[r].raw(), again[r].raw(), got[r].bytes()) == 0);
    }
  CHECK(compared > 3 * 20);
}

namespace {

// Copies rows (b, h, t) of Dh elements from src to dst at the given element offsets.
template <class SrcAt, class DstAt>
void copyRows(const HostTensor& src, HostTensor& dst, int64_t B, int64_t H, int64_t T, int64_t D, SrcAt srcAt,
              DstAt dstAt) {
  const size_t es = static_cast<size_t>(dtypeSize(src.dtype()));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t t = 0; t < T; ++t)
        std::memcpy(dst.raw() + dstAt(b, h, t) * es, src.raw() + srcAt(b, h, t) * es, static_cast<size_t>(D) * es);
}

void checkClose(const HostTensor& got, const HostTensor& want, double tol) {
  std::vector<double> g = values(got), w = values(want);
  REQUIRE(g.size() == w.size());
  double rms = 0;
  for (double v : w) rms += v * v;
  rms = std::sqrt(rms / std::max<size_t>(w.size(), 1));
  int bad = 0;
  for (size_t i = 0; i < g.size(); ++i) bad += !(std::abs(g[i] - w[i]) <= tol * (std::abs(w[i]) + rms));
  CHECK(bad == 0);
}

}  // namespace

// attention_qkv runs attention's kernels with the packed layout's strides: on the GPU it gives what attention
// gives on q, k, v sliced out of the same tensor (out, lse and the gradients), dropout mask included.
TEST_CASE("cuda kernels: attention_qkv and its gradient equal attention on the unpacked q, k, v", "[gpu]") {
  cuda::NvrtcCompiler nvrtc(gpuArch());
  struct P {
    const char* name;
    DType dt;
    int64_t B, T, H, D;
    std::vector<int64_t> perm;
    AttrDict a;
  };
  const DType f = DType::f32, bf = DType::bf16;
  std::vector<P> cases = {
      {"f32 D64 [B,T,3,H,Dh] dropout", f, 2, 200, 3, 64, {2, 0, 3, 1, 4},
       attrs({{"causal", true}, {"dropout", 0.1}, {"key", 4}})},
      {"bf16 gpt2 [B,T,3,H,Dh]", bf, 2, 1024, 12, 64, {2, 0, 3, 1, 4}, attrs({{"causal", true}})},
      {"bf16 D128 [B,3,T,H,Dh] dropout sharded heads", bf, 2, 300, 4, 128, {1, 0, 3, 2, 4},
       attrs({{"causal", true}, {"dropout", 0.1}, {"key", 2}, {"global_shape", std::vector<int64_t>{2, 8}},
              {"offsets", std::vector<int64_t>{0, 4}}})},
  };
  for (const P& x : cases) {
    INFO(x.name);
    const double tol = x.dt == f ? 1e-5 : 1e-2;
    AttrDict ap = x.a;
    ap.set("perm", x.perm);
    const Shape qkvShape = packedShape(x.B, x.T, x.H, x.D, x.perm);
    auto p = packedQkv(qkvShape, x.perm);
    REQUIRE(p.ok());
    const TensorType xt(x.dt, qkvShape), ht(x.dt, {x.B, x.H, x.T, x.D}), tt_(x.dt, {x.B, x.T, x.H, x.D}),
        lt(f, {x.B, x.H, x.T});
    auto packedAt = [&](int which) {
      return [&, which](int64_t b, int64_t h, int64_t t) {
        return which * p->sWhich + b * p->sBatch + h * p->sHead + t * p->sToken;
      };
    };
    auto headsAt = [&](int64_t b, int64_t h, int64_t t) { return ((b * x.H + h) * x.T + t) * x.D; };
    auto tokensAt = [&](int64_t b, int64_t h, int64_t t) { return ((b * x.T + t) * x.H + h) * x.D; };
    std::mt19937 rng(std::hash<std::string>{}(x.name) & 0xffffffff);
    HostTensor X = uniformT(xt, rng), dOt = uniformT(tt_, rng);
    std::vector<HostTensor> qkv;
    for (int which = 0; which < 3; ++which) {
      HostTensor t(ht);
      copyRows(X, t, x.B, x.H, x.T, x.D, packedAt(which), headsAt);
      qkv.push_back(t);
    }
    HostTensor dOh(ht);
    copyRows(dOt, dOh, x.B, x.H, x.T, x.D, tokensAt, headsAt);
    const uint64_t seed = 99;
    const int64_t step = 5;
    auto run = [&](OpKind op, std::vector<TensorType> types, const AttrDict& a, const std::vector<HostTensor>& in) {
      OneOp o = oneOp(op, types, a);
      auto low = (*cuda::findFamilyLowering(op))(*o.node, sm90());
      REQUIRE(low.ok());
      return runGpu(nvrtc, o, *low, in, seed, step);
    };
    std::vector<HostTensor> fwd = run(OpKind::Attention, {ht, ht, ht}, x.a, qkv);
    std::vector<HostTensor> pfwd = run(OpKind::AttentionQkv, {xt}, ap, {X});
    HostTensor oHeads(ht);
    copyRows(pfwd[0], oHeads, x.B, x.H, x.T, x.D, tokensAt, headsAt);
    checkClose(oHeads, fwd[0], tol);
    checkClose(pfwd[1], fwd[1], 1e-5);
    std::vector<HostTensor> grad =
        run(OpKind::AttentionGrad, {ht, ht, ht, ht, ht, lt}, x.a, {dOh, qkv[0], qkv[1], qkv[2], fwd[0], fwd[1]});
    std::vector<HostTensor> pgrad = run(OpKind::AttentionQkvGrad, {tt_, xt, tt_, lt}, ap, {dOt, X, pfwd[0], pfwd[1]});
    for (int which = 0; which < 3; ++which) {
      INFO("d" << "qkv"[which]);
      HostTensor d(ht);
      copyRows(pgrad[0], d, x.B, x.H, x.T, x.D, packedAt(which), headsAt);
      checkClose(d, grad[static_cast<size_t>(which)], tol);
    }
  }
}
