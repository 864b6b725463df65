// Hidden benchmark (`tpc_gpu_tests "[.bench]"`): the memory-bound kernel families at gpt2 sizes (micro batch
// 16 x 1024, bf16): cross_entropy(_grad) over the padded vocabulary, layer_norm(_grad), embedding_grad, the bias-gradient
// reduce_sum and global_norm over gpt2's and gpt2-medium's parameters. Timed with CUDA events; prints ms
// and the effective bandwidth (bytes of the operands read plus the results written, once each).
#include <cuda_runtime.h>

#include <catch2/catch.hpp>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>

#include "cuda_kernel_cases.h"
#include "gpu_test_support.h"
#include "runtime/cuda/nvrtc_compiler.h"

using namespace tpc;
using namespace tpc::test;
using namespace tpc::test::kernels;

namespace {

// n values of dtype t drawn in [lo, hi) (integers: [lo, hi] rounded down), made from a host block of at
// most 4M values copied over and over (the values' order does not matter to these kernels).
void* deviceRandom(DType t, int64_t n, double lo, double hi, std::mt19937& rng) {
  size_t es = static_cast<size_t>(dtypeSize(t)), block = static_cast<size_t>(std::min<int64_t>(std::max<int64_t>(n, 1), 1 << 22));
  std::vector<uint8_t> h(block * es);
  std::uniform_real_distribution<double> u(lo, hi);
  for (size_t i = 0; i < block; ++i) {
    double v = u(rng);
    float f = static_cast<float>(v);
    uint32_t bits;
    std::memcpy(&bits, &f, 4);
    if (t == DType::f32) std::memcpy(&h[i * 4], &f, 4);
    else if (t == DType::bf16) { uint16_t b = static_cast<uint16_t>(bits >> 16); std::memcpy(&h[i * 2], &b, 2); }
    else if (t == DType::i32) { int32_t k = static_cast<int32_t>(std::floor(v)); std::memcpy(&h[i * 4], &k, 4); }
    else FAIL("deviceRandom: dtype " << dtypeName(t));
  }
  void* p = nullptr;
  size_t bytes = static_cast<size_t>(n) * es;
  CUDA_OK(cudaMalloc(&p, std::max<size_t>(bytes, 1)));
  for (size_t at = 0; at < bytes; at += h.size())
    CUDA_OK(cudaMemcpy(static_cast<char*>(p) + at, h.data(), std::min(h.size(), bytes - at), cudaMemcpyHostToDevice));
  return p;
}

struct Bench {
  cuda::NvrtcCompiler& nvrtc;
  cuda::LoweringContext ctx;
  void* step = nullptr;

  // Lowers one op on the given device operands, runs it 2 + iters times and prints the mean time.
  void run(const std::string& what, OneOp& o, const std::vector<void*>& ops, int iters = 20) {
    auto low = (*cuda::findFamilyLowering(o.node->op()))(*o.node, ctx);
    REQUIRE(low.ok());
    std::vector<std::pair<cudaKernel_t, KernelSpec>> ks;
    for (const KernelSpec& k : low->kernels) {
      auto cubin = nvrtc.compile(k.source, k.entry);
      if (!cubin.ok()) FAIL(cubin.error());
      cudaLibrary_t lib;
      CUDA_OK(cudaLibraryLoadData(&lib, cubin->data(), nullptr, nullptr, 0, nullptr, nullptr, 0));
      cudaKernel_t fn;
      CUDA_OK(cudaLibraryGetKernel(&fn, lib, k.entry.c_str()));
      if (k.sharedBytes > 48 * 1024)
        CUDA_OK(cudaFuncSetAttribute(reinterpret_cast<const void*>(fn), cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     static_cast<int>(k.sharedBytes)));
      ks.push_back({fn, k});
    }
    std::vector<void*> res;
    double bytes = 0;
    for (const Value* v : o.node->operands()) bytes += static_cast<double>(v->type().bytes());
    for (const Value* r : o.node->results()) {
      void* p = nullptr;
      CUDA_OK(cudaMalloc(&p, std::max<size_t>(static_cast<size_t>(r->type().bytes()), 1)));
      res.push_back(p);
      bytes += static_cast<double>(r->type().bytes());
    }
    char* ws = nullptr;
    CUDA_OK(cudaMalloc(reinterpret_cast<void**>(&ws), static_cast<size_t>(std::max<int64_t>(low->workspaceBytes, 1))));
    const size_t wsBytes = static_cast<size_t>(std::max<int64_t>(low->workspaceBytes, 1));
    auto all = [&] {
      if (low->zeroWorkspace) CUDA_OK(cudaMemsetAsync(ws, 0, wsBytes, 0));  // as the runtime does before the kernels
      for (auto& [fn, k] : ks) {
        ArgPack pack(k, ops, res, ws, 4242, step);
        CUDA_OK(cudaLaunchKernel(reinterpret_cast<const void*>(fn), dim3(k.grid.x, k.grid.y, k.grid.z),
                                 dim3(k.block.x, k.block.y, k.block.z), pack.args.data(), k.sharedBytes, 0));
      }
    };
    for (int i = 0; i < 2; ++i) all();
    CUDA_OK(cudaGetLastError());
    cudaEvent_t a, b;
    CUDA_OK(cudaEventCreate(&a));
    CUDA_OK(cudaEventCreate(&b));
    CUDA_OK(cudaEventRecord(a));
    for (int i = 0; i < iters; ++i) all();
    CUDA_OK(cudaEventRecord(b));
    CUDA_OK(cudaEventSynchronize(b));
    float ms = 0;
    CUDA_OK(cudaEventElapsedTime(&ms, a, b));
    ms /= static_cast<float>(iters);
    // The first result is finite (a kernel that failed silently leaves NaN bytes or garbage).
    const Value* r0 = o.node->result(0);
    int64_t n0 = std::min<int64_t>(r0->type().numel(), 4096);
    std::vector<float> head(static_cast<size_t>(n0));
    if (r0->dtype() == DType::f32 && n0) {
      CUDA_OK(cudaMemcpy(head.data(), res[0], static_cast<size_t>(n0) * 4, cudaMemcpyDeviceToHost));
      for (float v : head) CHECK(std::isfinite(v));
    }
    // A hash of every result's bits, to tell whether two variants of a kernel agree bit for bit.
    uint64_t h = 1469598103934665603ull;
    for (size_t r = 0; r < res.size(); ++r) {
      std::vector<unsigned char> host(static_cast<size_t>(o.node->result(r)->type().bytes()));
      CUDA_OK(cudaMemcpy(host.data(), res[r], host.size(), cudaMemcpyDeviceToHost));
      for (unsigned char c : host) h = (h ^ c) * 1099511628211ull;
    }
    std::printf("%-52s %3zu launches %9.4f ms %8.0f GB/s  bits %016llx\n", what.c_str(), ks.size(), ms, bytes / ms / 1e6,
                static_cast<unsigned long long>(h));
    std::fflush(stdout);
    cudaEventDestroy(a);
    cudaEventDestroy(b);
    for (void* p : res) cudaFree(p);
    cudaFree(ws);
  }
};

// gpt2-style parameter shapes: wte, wpe, per layer ln1 (g, b), qkv (w, b), proj (w, b), ln2 (g, b), fc (w, b),
// fc2 (w, b), then ln_f (g, b).
std::vector<TensorType> gptParams(int64_t layers, int64_t d) {
  std::vector<TensorType> ps = {tt(DType::f32, {50304, d}), tt(DType::f32, {1024, d})};
  for (int64_t l = 0; l < layers; ++l)
    for (Shape s : std::vector<Shape>{{d}, {d}, {d, 3 * d}, {3 * d}, {d, d}, {d}, {d}, {d}, {d, 4 * d}, {4 * d}, {4 * d, d}, {d}})
      ps.push_back(tt(DType::f32, s));
  ps.push_back(tt(DType::f32, {d}));
  ps.push_back(tt(DType::f32, {d}));
  return ps;
}

}  // namespace

TEST_CASE("bench: loss, layer_norm, embedding_grad, bias reduce_sum and global_norm kernels at gpt2 sizes", "[.bench]") {
  requireGpuOrSkip();
  cudaDeviceProp prop{};
  CUDA_OK(cudaGetDeviceProperties(&prop, 0));
  cuda::NvrtcCompiler nvrtc(prop.major * 10 + prop.minor);
  Bench b{nvrtc, {}, nullptr};
  b.ctx.smMajor = prop.major;
  b.ctx.smMinor = prop.minor;
  b.ctx.maxSharedBytes = static_cast<int64_t>(prop.sharedMemPerBlockOptin);
  b.ctx.numSMs = prop.multiProcessorCount;
  b.ctx.sharedPerSM = static_cast<int64_t>(prop.sharedMemPerMultiprocessor);
  CUDA_OK(cudaMalloc(&b.step, 8));
  CUDA_OK(cudaMemset(b.step, 0, 8));
  std::mt19937 rng(5);
  const DType bf = DType::bf16, f = DType::f32;
  const int64_t rows = 16 * 1024, V = 50304, C = 50257;
  {
    TensorType lt = tt(bf, {rows, V}), tg = tt(DType::i32, {rows}), dl = tt(f, {rows});
    AttrDict a = attrs({{"ignore_index", int64_t(-1)}, {"num_classes", C}});
    void* logits = deviceRandom(bf, rows * V, -4, 4, rng);
    void* targets = deviceRandom(DType::i32, rows, 0, double(C - 1), rng);
    void* dloss = deviceRandom(f, rows, 1.0 / rows, 1.0 / rows, rng);
    OneOp ce = oneOp(OpKind::CrossEntropy, {lt, tg}, a);
    b.run("cross_entropy bf16 [16384, 50304] C=50257", ce, {logits, targets});
    OneOp ceg = oneOp(OpKind::CrossEntropyGrad, {dl, lt, tg}, a);
    b.run("cross_entropy_grad bf16 [16384, 50304] C=50257", ceg, {dloss, logits, targets});
    OneOp cewg = oneOp(OpKind::CrossEntropyWithGrad, {dl, lt, tg}, a);
    for (bool resident : {true, false}) {  // LoweringContext::xentOnePass: loss_resident.cpp's kernel or loss.cpp's
      b.ctx.xentOnePass = resident;
      b.run(cat("cross_entropy_with_grad bf16 [16384, 50304]", resident ? "" : " (old)"), cewg, {dloss, logits, targets});
    }
    b.ctx.xentOnePass = true;
    for (void* p : {logits, targets, dloss}) cudaFree(p);
  }
  for (int64_t D : {int64_t(768), int64_t(1024)}) {
    TensorType x = tt(bf, {rows, D}), g = tt(f, {D});
    void *X = deviceRandom(bf, rows * D, -2, 2, rng), *DY = deviceRandom(bf, rows * D, -1, 1, rng);
    void *G = deviceRandom(f, D, 0.5, 1.5, rng), *B = deviceRandom(f, D, -1, 1, rng);
    void* R = deviceRandom(bf, rows * D, -1, 1, rng);
    OneOp ln = oneOp(OpKind::LayerNorm, {x, g, g}, attrs({{"eps", 1e-5}}));
    b.run(cat("layer_norm bf16 [16384, ", D, "]"), ln, {X, G, B});
    OneOp lng = oneOp(OpKind::LayerNormGrad, {x, x, g}, attrs({{"eps", 1e-5}}));
    OneOp lngr = oneOp(OpKind::LayerNormGrad, {x, x, g, x}, attrs({{"eps", 1e-5}}));
    for (bool blocks : {true, false}) {  // LoweringContext::layerNormGradBlocks (TPC_MEMBW_OFF=lngrad2: the old kernel)
      b.ctx.layerNormGradBlocks = blocks;
      const char* old = blocks ? "" : " (old)";
      b.run(cat("layer_norm_grad bf16 [16384, ", D, "]", old), lng, {DY, X, G});
      b.run(cat("layer_norm_grad bf16 [16384, ", D, "] residual", old), lngr, {DY, X, G, R});
    }
    b.ctx.layerNormGradBlocks = true;
    // With sum_dx (the residual stream's bias gradient), sums in shared memory or registers
    // (LoweringContext::layerNormGradRegColumns / RegSumColumns).
    OneOp lngs = oneOp(OpKind::LayerNormGrad, {x, x, g, x}, attrs({{"eps", 1e-5}, {"sum_dx", true}}));
    for (auto [reg, regSum] : std::vector<std::pair<int, int>>{{0, 0}, {32, 0}, {32, 32}}) {
      b.ctx.layerNormGradRegColumns = reg;
      b.ctx.layerNormGradRegSumColumns = regSum;
      b.run(cat("layer_norm_grad bf16 [16384, ", D, "] residual (regs ", reg, ")"), lngr, {DY, X, G, R});
      b.run(cat("layer_norm_grad bf16 [16384, ", D, "] residual sum_dx (regs ", reg, " ", regSum, ")"), lngs, {DY, X, G, R});
    }
    b.ctx.layerNormGradRegColumns = cuda::LoweringContext{}.layerNormGradRegColumns;
    b.ctx.layerNormGradRegSumColumns = cuda::LoweringContext{}.layerNormGradRegSumColumns;
    // gamma from shared memory where that is faster, or always from global memory (LoweringContext::
    // layerNormGradGammaShared; TPC_MEMBW_OFF=lngamma).
    for (bool shared : {true, false}) {
      b.ctx.layerNormGradGammaShared = shared;
      const char* how = shared ? "" : " (gamma global)";
      b.run(cat("layer_norm_grad bf16 [16384, ", D, "] residual", how), lngr, {DY, X, G, R});
      b.run(cat("layer_norm_grad bf16 [16384, ", D, "] residual sum_dx", how), lngs, {DY, X, G, R});
    }
    b.ctx.layerNormGradGammaShared = true;
    // x, dy and the residual through a cp.async ring of rows a warp (LoweringContext::layerNormGradStages; 0: the
    // next row prefetched into registers), with the default sums and with every sum in registers.
    for (int stages : {0, 2, 3, 4}) {
      b.ctx.layerNormGradStages = stages;
      for (auto [reg, regSum] : std::vector<std::pair<int, int>>{{24, 0}, {32, 32}}) {
        b.ctx.layerNormGradRegColumns = reg;
        b.ctx.layerNormGradRegSumColumns = regSum;
        const std::string how = cat(" (stages ", stages, ", regs ", reg, " ", regSum, ")");
        if (regSum == 0) b.run(cat("layer_norm_grad bf16 [16384, ", D, "]", how), lng, {DY, X, G});
        b.run(cat("layer_norm_grad bf16 [16384, ", D, "] residual", how), lngr, {DY, X, G, R});
        b.run(cat("layer_norm_grad bf16 [16384, ", D, "] residual sum_dx", how), lngs, {DY, X, G, R});
      }
    }
    b.ctx.layerNormGradStages = cuda::LoweringContext{}.layerNormGradStages;
    b.ctx.layerNormGradRegColumns = cuda::LoweringContext{}.layerNormGradRegColumns;
    b.ctx.layerNormGradRegSumColumns = cuda::LoweringContext{}.layerNormGradRegSumColumns;
    for (void* p : {X, DY, G, B, R}) cudaFree(p);
  }
  {
    // embedding_grad of gpt2's wte: 16384 token ids drawn from a Zipf-like law (as text: a few ids hundreds of
    // times, most of the table unused), and uniformly.
    std::vector<double> w(static_cast<size_t>(C));
    for (size_t k = 0; k < w.size(); ++k) w[k] = 1.0 / (static_cast<double>(k) + 2.7);
    std::discrete_distribution<int32_t> zipf(w.begin(), w.end());
    std::vector<int32_t> hostIds(static_cast<size_t>(rows));
    for (int32_t& id : hostIds) id = zipf(rng);
    void* zipfIds = nullptr;
    CUDA_OK(cudaMalloc(&zipfIds, hostIds.size() * 4));
    CUDA_OK(cudaMemcpy(zipfIds, hostIds.data(), hostIds.size() * 4, cudaMemcpyHostToDevice));
    void* uniformIds = deviceRandom(DType::i32, rows, 0, double(C - 1), rng);
    void* DY = deviceRandom(bf, rows * 768, -1, 1, rng);
    OneOp eg = oneOp(OpKind::EmbeddingGrad, {tt(bf, {rows, 768}), tt(DType::i32, {rows})}, attrs({{"vocab", V}}));
    for (bool segments : {true, false}) {  // LoweringContext::embeddingGradSegments (TPC_MEMBW_OFF=embgrad2: the old one)
      b.ctx.embeddingGradSegments = segments;
      const char* old = segments ? "" : " (old)";
      b.run(cat("embedding_grad bf16 [16384, 768] vocab 50304 zipf ids", old), eg, {DY, zipfIds}, segments ? 20 : 3);
      b.run(cat("embedding_grad bf16 [16384, 768] vocab 50304 uniform ids", old), eg, {DY, uniformIds}, segments ? 20 : 3);
    }
    b.ctx.embeddingGradSegments = true;
    for (void* p : {zipfIds, uniformIds, DY}) cudaFree(p);
  }
  for (int64_t N : {int64_t(768), int64_t(2304), int64_t(3072)}) {
    TensorType x = tt(bf, {16, 1024, N});
    void* X = deviceRandom(bf, rows * N, -1, 1, rng);
    OneOp r = oneOp(OpKind::ReduceSum, {x}, attrs({{"axes", std::vector<int64_t>{0, 1}}, {"keepdims", false}}));
    // LoweringContext::columnReduce(Wave): the 16-byte chunked kernel in one wave, in 16 waves, or the generic one
    for (int variant : {0, 1, 2}) {
      b.ctx.columnReduce = variant < 2;
      b.ctx.columnReduceWave = variant == 0;
      b.run(cat("reduce_sum bf16 [16, 1024, ", N, "] axes [0, 1]", variant == 1 ? " (16 waves)" : variant == 2 ? " (old)" : ""), r, {X});
    }
    b.ctx.columnReduce = b.ctx.columnReduceWave = true;
    cudaFree(X);
  }
  for (auto [name, layers, d] : std::vector<std::tuple<const char*, int64_t, int64_t>>{{"gpt2", 12, 768}, {"gpt2-medium", 24, 1024}}) {
    std::vector<TensorType> ps = gptParams(layers, d);
    std::vector<void*> bufs;
    for (const TensorType& t : ps) bufs.push_back(deviceRandom(f, t.numel(), -1e-3, 1e-3, rng));
    OneOp gn = oneOp(OpKind::GlobalNorm, ps);
    b.run(cat("global_norm ", name, " (", ps.size(), " f32 tensors)"), gn, bufs);
    for (void* p : bufs) cudaFree(p);
  }
  cudaFree(b.step);
}
