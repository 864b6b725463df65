// cuBLASLt epilogues (fold-matmul-epilogues, CudaOptions::matmulEpilogues) on the GPU: each epilogue against
// the unfused ops it replaces on random inputs (fp32 within 1e-5, bf16 within 1e-2 of the largest value), with
// fewer launches (cuBLASLt took the epilogue); and a 2-layer GPT trained with and without them (with its
// attentions packed by pack-qkv-attention in both), unsharded and on megatron-tp 2 virtual ranks.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <functional>
#include <optional>
#include <random>

#include "fusion_test_support.h"
#include "gpu_test_support.h"
#include "gpu_train_steps.h"
#include "runtime/cpu/cpu_backend.h"
#include "runtime/cuda/cuda_backend.h"
#include "runtime/param_init.h"

namespace tpc {
namespace {

struct Outcome {
  TensorMap out;
  int64_t launches = 0;
};

Outcome runOnce(const Graph& g, const TensorMap& inputs, bool epilogues) {
  CudaOptions o;
  o.verbose = false;
  o.matmulEpilogues = epilogues;
  o.matmulEpilogueKinds = "all";  // dgelu_bgrad too (the backend's default folds every other kind)
  o.ownGemm = "";                  // cuBLASLt's epilogues (ours have their own cases below)
  auto backend = createCudaBackend({}, o);
  TensorMap state;
  for (const Value* p : g.params()) state[p->name()] = initParam(*p, 1);
  Status st = backend->prepare(g, state);
  INFO((st.ok() ? std::string() : st.error()));
  REQUIRE(st.ok());
  auto r = backend->step(inputs, 1);
  INFO((r.ok() ? std::string() : r.error()));
  REQUIRE(r.ok());
  return {*r, backend->launchesPerStep()};
}

// The unfused ops of one epilogue, in dtype t.
std::unique_ptr<Graph> unfused(const std::string& e, DType t) {
  auto g = std::make_unique<Graph>(e);
  auto T = [&](Shape s) { return TensorType(t, std::move(s)); };
  auto op = [&](OpKind k, std::vector<Value*> ops, AttrDict a = {}) {
    auto n = g->create(k, ops, std::move(a));
    REQUIRE(n.ok());
    return (*n)->result();
  };
  AttrDict tb, ta, rows, all;
  tb.set("transpose_b", true);
  ta.set("transpose_a", true);
  rows.set("axes", std::vector<int64_t>{0, 1});
  all.set("axes", std::vector<int64_t>{0});
  if (e == "bias" || e == "bias+residual" || e == "gelu_bias") {
    Value* x = g->addInput("x", T({4, 32, 64}));
    Value* w = g->addInput("w", T({64, 96}));
    Value* bias = g->addInput("bias", T({96}));
    Value* p = op(OpKind::Add, {op(OpKind::Matmul, {x, w}), bias});
    if (e == "bias") g->addOutput(p, "y");
    if (e == "bias+residual") g->addOutput(op(OpKind::Add, {g->addInput("res", T({4, 32, 96})), p}), "y");
    if (e == "gelu_bias") {
      g->addOutput(op(OpKind::Gelu, {p}), "y");
      g->addOutput(p, "pre");
    }
  } else if (e == "dgelu" || e == "dgelu_bgrad") {
    Value* dy = g->addInput("dy", T({4, 32, 64}));
    Value* w = g->addInput("w", T({96, 64}));
    Value* pre = g->addInput("pre", T({4, 32, 96}));
    Value* d = op(OpKind::GeluGrad, {op(OpKind::Matmul, {dy, w}, tb), pre});
    g->addOutput(d, "dx");
    if (e == "dgelu_bgrad") g->addOutput(op(OpKind::ReduceSum, {d}, rows), "db");
  } else {  // bgrad_b: a weight gradient and the bias gradient of the same rows
    Value* x = g->addInput("x", T({128, 64}));
    Value* d = g->addInput("d", T({128, 96}));
    g->addOutput(op(OpKind::Matmul, {x, d}, ta), "dw");
    g->addOutput(op(OpKind::ReduceSum, {d}, all), "db");
  }
  return g;
}

// One step of `g` on the GPU; ownGemm: CudaOptions::ownGemm, the epilogue kinds our GEMM kernel runs (else
// cuBLASLt's). `info`: the step's launches (of our GEMM kernel, in clusters). repeats > 1: the step runs again
// that many times and each must give the first one's bits (a race between the blocks shows as a rare change).
struct StepRun {
  TensorMap out;
  CudaStepGraphInfo info;
};
StepRun ownGemmOnGpu(const Graph& g, const TensorMap& in, bool epilogues, const std::string& ownGemm, int repeats = 1) {
  CudaOptions o;
  o.verbose = false;
  o.matmulEpilogues = epilogues;
  o.ownGemm = ownGemm;
  auto backend = createCudaBackend({}, o);
  Status st = backend->prepare(g, {});
  INFO((st.ok() ? std::string() : st.error()));
  REQUIRE(st.ok());
  auto r = backend->step(in, 1);
  INFO((r.ok() ? std::string() : r.error()));
  REQUIRE(r.ok());
  auto info = cudaStepGraphInfo(*backend);
  REQUIRE(info);
  int64_t changed = 0;
  for (int i = 1; i < repeats; ++i) {
    auto again = backend->step(in, 1 + i);
    REQUIRE(again.ok());
    for (const auto& [name, t] : *r)
      changed += std::memcmp(t.raw(), (*again).at(name).raw(), t.bytes()) != 0;
  }
  CHECK(changed == 0);
  return {*r, *info};
}

// Largest |got - want| over the largest |want|.
double difference(const HostTensor& got, const HostTensor& want) {
  REQUIRE(got.numel() == want.numel());
  double worst = 0, scale = 0;
  for (int64_t i = 0; i < want.numel(); ++i) {
    double d = std::abs(got.getAsDouble(i) - want.getAsDouble(i));
    scale = std::max(scale, std::abs(want.getAsDouble(i)));
    worst = std::isnan(d) ? INFINITY : std::max(worst, d);
  }
  return worst / std::max(scale, 1e-30);
}

bool onSm90() {
  cudaDeviceProp prop{};
  REQUIRE(cudaGetDeviceProperties(&prop, 0) == cudaSuccess);
  return prop.major == 9 && prop.minor == 0;
}

// [rows / 256, 256, K] x w ([K, N], or [N, K] with transpose_b) in g, bf16.
Value* bf16Matmul(Graph& g, Value* a, Value* w, bool transposeB) {
  AttrDict tb;
  if (transposeB) tb.set("transpose_b", true);
  auto mm = g.create(OpKind::Matmul, {a, w}, tb);
  REQUIRE(mm.ok());
  return (*mm)->result();
}

// add(x w, bias) in g: x [rows / 256, 256, K], w [K, N] (or [N, K], transpose_b) and bias [N], bf16 inputs.
Value* matmulPlusBias(Graph& g, int64_t rows, int64_t K, int64_t N, bool transposeB) {
  auto T = [&](Shape s) { return TensorType(DType::bf16, std::move(s)); };
  Value* x = g.addInput("x", T({rows / 256, 256, K}));
  Value* w = g.addInput("w", T(transposeB ? Shape{N, K} : Shape{K, N}));
  auto sum = g.create(OpKind::Add, {bf16Matmul(g, x, w, transposeB), g.addInput("bias", T({N}))});
  REQUIRE(sum.ok());
  return (*sum)->result();
}

// Every input of g drawn uniformly from [-span, span] (spanOf its name), in order; bf16Values: rounded to bf16
// on the host, so that a double reference sees the GPU's inputs.
TensorMap uniformInputs(const Graph& g, uint32_t seed, const std::function<double(const std::string&)>& spanOf,
                        bool bf16Values) {
  std::mt19937 rng(seed);
  TensorMap in;
  for (const Value* v : g.inputs()) {
    HostTensor t(TensorType(DType::f32, v->shape()));
    double span = spanOf(v->name());
    for (int64_t i = 0; i < t.numel(); ++i) {
      float x = static_cast<float>(std::uniform_real_distribution<double>(-span, span)(rng));
      t.data<float>()[i] = bf16Values ? bf16ToFloat(floatToBf16(x)) : x;
    }
    in[v->name()] = t;
  }
  return in;
}

// g run with our GEMM kernel for `kind`, with cuBLASLt's epilogue and unfused: our kernel launched once on an
// sm_90 GPU and never otherwise. Ours also runs in clusters of two blocks sharing b's tiles (TPC_OWN_GEMM's
// multicast), which must give the same bits: each block sums its tile's products in the same order either way;
// and dgelu with pre1 (pre copied 1 chunk ahead instead of 3), the same bits too.
struct ThreeWays {
  TensorMap ours, cublas, unfused;
};
ThreeWays runThreeWays(const Graph& g, const TensorMap& in, const std::string& kind, bool sm90) {
  StepRun own = ownGemmOnGpu(g, in, true, kind), lt = ownGemmOnGpu(g, in, true, ""), none = ownGemmOnGpu(g, in, false, kind);
  StepRun mc = ownGemmOnGpu(g, in, true, kind + ",multicast", 20);
  CHECK(own.info.gemmKernels == (sm90 ? 1 : 0));
  CHECK(own.info.clusteredGemmKernels == 0);
  CHECK(mc.info.gemmKernels == (sm90 ? 1 : 0));
  CHECK(mc.info.clusteredGemmKernels == (sm90 ? 1 : 0));  // every case has an even count of 128-row tiles
  CHECK(mc.info.clusteredGemmBlocks % 2 == 0);
  WARN("multicast: " << mc.info.clusteredGemmBlocks << " blocks in clusters of two");
  CHECK(lt.info.gemmKernels == 0);
  CHECK(none.info.gemmKernels == 0);
  if (!sm90) WARN("not an sm_90 GPU: cuBLASLt ran both ways");
  for (const auto& [name, t] : own.out) {
    INFO(name << ": ours in clusters of two against ours alone");
    const HostTensor& other = mc.out.at(name);
    REQUIRE(other.bytes() == t.bytes());
    CHECK(std::memcmp(t.raw(), other.raw(), t.bytes()) == 0);
  }
  // dgelu copies pre (bias_residual r) 3 chunks ahead of its use, or 1 with pre1: where it waits changes, not
  // what it computes.
  if (kind.rfind("dgelu", 0) == 0 || kind == "bias_residual") {
    StepRun p1 = ownGemmOnGpu(g, in, true, kind + ",pre1");
    CHECK(p1.info.gemmKernels == (sm90 ? 1 : 0));
    for (const auto& [name, t] : own.out) {
      INFO(name << ": ours with pre copied 1 chunk ahead against 3");
      const HostTensor& other = p1.out.at(name);
      REQUIRE(other.bytes() == t.bytes());
      CHECK(std::memcmp(t.raw(), other.raw(), t.bytes()) == 0);
    }
  }
  return {own.out, lt.out, none.out};
}

// The outputs `names` of ours against the CPU backend's unfused ops: within 1.6e-2 of the largest value.
void checkAgainstCpu(const Graph& g, const TensorMap& in, const TensorMap& ours, std::initializer_list<const char*> names) {
  CpuOptions co;
  co.threads = 2;
  auto cpu = createCpuBackend(co);
  REQUIRE(cpu->prepare(g, {}).ok());
  auto ref = cpu->step(in, 1);
  REQUIRE(ref.ok());
  for (const char* name : names) {
    double rel = difference(ours.at(name), ref->at(name));
    WARN(name << ": ours vs the CPU backend: max difference over max value " << rel);
    CHECK(rel <= 1.6e-2);
  }
}

// reduce_sum(v) over its two leading dims ([rows / 256, 256, N] -> [N]): a bias gradient.
Value* sumOverRows(Graph& g, Value* v) {
  AttrDict rowsAxes;
  rowsAxes.set("axes", std::vector<int64_t>{0, 1});
  auto db = g.create(OpKind::ReduceSum, {v}, rowsAxes);
  REQUIRE(db.ok());
  return (*db)->result();
}

// db [cols] against the column sums in double of src [rows, cols]: the worst |db - sum| over a bf16 step of the
// sum plus 1e-5 of the column's sum of |src| (1 or less passes).
double worstColumnSum(const HostTensor& src, int64_t rows, int64_t cols, const HostTensor& db) {
  double worst = 0;
  for (int64_t n = 0; n < cols; ++n) {
    double sum = 0, sumAbs = 0;
    for (int64_t r = 0; r < rows; ++r) {
      sum += src.getAsDouble(r * cols + n);
      sumAbs += std::abs(src.getAsDouble(r * cols + n));
    }
    double step = sum == 0 ? 0.0 : std::ldexp(1.0, std::ilogb(sum) - 7);
    double diff = std::abs(db.getAsDouble(n) - sum) / std::max(step + 1e-5 * sumAbs, 1e-38);
    worst = std::isnan(diff) ? INFINITY : std::max(worst, diff);
  }
  return worst;
}

// Output `name` of ours against the cuBLASLt run's (`lt`: what that run was) within 8e-3 of the largest value,
// and the unfused ops' within `unfusedTol`.
void checkLtAndUnfused(const TensorMap& ours, const TensorMap& cublas, const TensorMap& unfused, const char* name,
                       const char* lt, double unfusedTol) {
  double relLt = difference(ours.at(name), cublas.at(name)), relUnfused = difference(ours.at(name), unfused.at(name));
  WARN(name << ": max difference over max value: ours vs " << lt << " " << relLt << ", vs the unfused ops " << relUnfused);
  CHECK(relLt <= 8e-3);
  CHECK(relUnfused <= unfusedTol);
}

}  // namespace

// gelu_bias at the tile multiples (M % 128, N % 256, K % 64) runs our sm_90 kernel (gemm_sm90.cpp) when asked:
// against cuBLASLt's GELU_AUX_BIAS and the unfused GPU ops, and for a few tiles against the CPU backend's unfused
// ops. gpt2's c_fc shape has 1536 tiles, 11.6 a block of the persistent grid; the 8192-row cases 320 (2.4 a
// block: the next-tile paths, the ring's stages and the store slots reused across tiles).
TEST_CASE("cuda epilogues: gelu_bias through our sm_90 GEMM kernel matches the CPU, cuBLASLt and the unfused ops",
          "[gpu][epilogue]") {
  test::requireGpuOrSkip();
  unsetenv("TPC_OWN_GEMM");  // it would override CudaOptions::ownGemm (the cuBLASLt runs below)
  const bool sm90 = onSm90();
  // rows, K, N, b given as [N, K] (transpose_b): K >= 512 defers each tile's gelu and stores into the next
  // tile's mainloop; K 256 does them after its own; b^T loads K-major tiles of b.
  for (auto [rows, K, N, bT] : std::vector<std::tuple<int64_t, int64_t, int64_t, bool>>{
           {512, 512, 768, false}, {512, 256, 512, false}, {1024, 512, 512, true}, {8192, 256, 1280, false},
           {8192, 512, 1280, true}, {16384, 768, 3072, false}, {512, 64, 512, false}, {512, 192, 512, true},
           {1024, 576, 768, true}}) {
    INFO("[" << rows << ", " << K << "] x [" << K << ", " << N << "]" << (bT ? " (b^T)" : ""));
    auto g = std::make_unique<Graph>("gelu_bias");
    Value* pre = matmulPlusBias(*g, rows, K, N, bT);
    auto y = g->create(OpKind::Gelu, {pre});
    REQUIRE(y.ok());
    g->addOutput((*y)->result(), "y");
    g->addOutput(pre, "pre");
    TensorMap in = uniformInputs(*g, 23, [&](const std::string& v) { return v == "w" ? 2.0 / std::sqrt(double(K)) : 1.0; },
                                 false);
    auto [ours, cublas, unfused] = runThreeWays(*g, in, "gelu_bias", sm90);
    for (const char* name : {"y", "pre"}) {
      double relLt = difference(ours.at(name), cublas.at(name)), relUnfused = difference(ours.at(name), unfused.at(name));
      WARN(name << ": max difference over max value: ours vs cuBLASLt's epilogue " << relLt << ", vs the unfused ops "
                << relUnfused);
      // pre: the f32 sum rounded once, as cuBLASLt (the unfused ops round the product, then the sum); y: gelu of
      // the rounded pre, the unfused ops' order (cuBLASLt: of the f32 sum). A bf16 step at the largest value is up
      // to 2^-7 of it: within one step of cuBLASLt, two of the unfused ops (which round twice).
      CHECK(relLt <= 8e-3);
      CHECK(relUnfused <= 1.6e-2);
    }
    if (K >= 512) {
      // y = gelu(pre) element by element (pre is the rounded sum here): within a bf16 rounding of gelu in double
      // at every element, negative pre included (where 1 + tanh cancels).
      const HostTensor &yv = ours.at("y"), &pv = ours.at("pre");
      double worstSteps = 0;
      for (int64_t i = 0; i < yv.numel(); ++i) {
        double p = pv.getAsDouble(i), want = 0.5 * p * (1 + std::tanh(0.7978845608028654 * (p + 0.044715 * p * p * p)));
        double step = want == 0 ? 1e-38 : std::ldexp(1.0, std::ilogb(want) - 7);  // bf16: 8 significant bits
        double d = std::abs(yv.getAsDouble(i) - want) / step;
        worstSteps = std::isnan(d) ? INFINITY : std::max(worstSteps, d);
      }
      WARN("y against gelu(pre) in double: worst " << worstSteps << " bf16 steps");
      CHECK(worstSteps <= 1.0);
    }
    if (rows <= 1024) checkAgainstCpu(*g, in, ours, {"y", "pre"});
  }
}

// bias (c_attn's y = x w + bias, no residual) at the tile multiples runs our sm_90 kernel when asked: the sum
// plus bias rounded once, as cuBLASLt's BIAS epilogue (the unfused ops round the product, then the sum).
TEST_CASE("cuda epilogues: bias through our sm_90 GEMM kernel matches the CPU, cuBLASLt and the unfused ops",
          "[gpu][epilogue]") {
  test::requireGpuOrSkip();
  unsetenv("TPC_OWN_GEMM");
  const bool sm90 = onSm90();
  for (auto [rows, K, N, bT] : std::vector<std::tuple<int64_t, int64_t, int64_t, bool>>{
           {512, 512, 768, false}, {1024, 256, 512, true}, {8192, 768, 2304, false}, {16384, 1024, 3072, true}}) {
    INFO("[" << rows << ", " << K << "] x [" << K << ", " << N << "]" << (bT ? " (b^T)" : ""));
    auto g = std::make_unique<Graph>("bias");
    g->addOutput(matmulPlusBias(*g, rows, K, N, bT), "y");
    TensorMap in = uniformInputs(*g, 29, [&](const std::string& v) { return v == "w" ? 2.0 / std::sqrt(double(K)) : 1.0; },
                                 false);
    auto [ours, cublas, unfused] = runThreeWays(*g, in, "bias", sm90);
    checkLtAndUnfused(ours, cublas, unfused, "y", "cuBLASLt's epilogue", 1.6e-2);
    if (rows <= 1024) checkAgainstCpu(*g, in, ours, {"y"});
  }
}

// bias_residual (the attention projection's and c_proj's y = r + (x w + bias), onto the residual stream) at the tile
// multiples runs our sm_90 kernel when asked: cuBLASLt's BIAS epilogue with beta 1 on r rounds the sum once; ours
// too where K < 512, and rounds x w + bias first with the deferred epilogue (K >= 512), one rounding fewer than the
// unfused ops. Shapes: gpt2's and gpt2-medium's projections (N = K) and gpt2's c_proj (K = 4N), and small ones with
// b^T and the exact epilogue. r spans [-4, 4], a residual stream's scale over the product's ~1.
TEST_CASE("cuda epilogues: bias_residual through our sm_90 GEMM kernel matches the CPU, cuBLASLt and the unfused ops",
          "[gpu][epilogue]") {
  test::requireGpuOrSkip();
  unsetenv("TPC_OWN_GEMM");
  const bool sm90 = onSm90();
  for (auto [rows, K, N, bT] : std::vector<std::tuple<int64_t, int64_t, int64_t, bool>>{
           {512, 512, 768, false}, {1024, 256, 512, true}, {16384, 768, 768, false}, {8192, 3072, 768, false},
           {16384, 1024, 1024, false}, {1024, 1024, 256, true}}) {
    INFO("[" << rows << ", " << K << "] x [" << K << ", " << N << "]" << (bT ? " (b^T)" : "") << " + r");
    auto g = std::make_unique<Graph>("bias_residual");
    Value* sum = matmulPlusBias(*g, rows, K, N, bT);
    auto y = g->create(OpKind::Add, {g->addInput("r", TensorType(DType::bf16, {rows / 256, 256, N})), sum});
    REQUIRE(y.ok());
    g->addOutput((*y)->result(), "y");
    TensorMap in = uniformInputs(*g, 31, [&](const std::string& v) {
      return v == "w" ? 2.0 / std::sqrt(double(K)) : v == "r" ? 4.0 : 1.0;
    }, false);
    auto [ours, cublas, unfused] = runThreeWays(*g, in, "bias_residual", sm90);
    checkLtAndUnfused(ours, cublas, unfused, "y", "cuBLASLt's epilogue", 1.6e-2);
    if (rows <= 1024) checkAgainstCpu(*g, in, ours, {"y"});
  }
}

// bgrad_a (an input gradient y = d w^T with d's bias gradient db = d's column sums: c_attn's over dQKV and c_fc's
// over DGELU's output) runs our sm_90 kernel when asked; cuBLASLt has no such epilogue, so without ours the
// matmul and the reduce_sum stay apart (the "cuBLASLt" run). y: the plain GEMM's bits up to its summation order;
// db: each k-slice's 16-row sums by the warps of one column tile, then in order in double; against the unfused
// ops and d's column sums in double, within a bf16 step of the sum plus 1e-5 of its sum of |d|. A 16-row group
// or a k-slice left out or counted twice moves a sum by about 4 mean |d|, past that. Shapes: gpt2's and
// gpt2-medium's c_attn and c_fc input gradients (3 and 4 column tiles sharing the k-slices), and small ones with
// b [K, N] and the exact epilogue (K < 512), and more column tiles than k-slices.
TEST_CASE("cuda epilogues: bgrad_a through our sm_90 GEMM kernel matches the CPU and the unfused ops",
          "[gpu][epilogue]") {
  test::requireGpuOrSkip();
  unsetenv("TPC_OWN_GEMM");
  const bool sm90 = onSm90();
  for (auto [rows, K, N, bT] : std::vector<std::tuple<int64_t, int64_t, int64_t, bool>>{
           {512, 768, 512, true}, {1024, 192, 1024, false}, {16384, 2304, 768, true}, {16384, 3072, 1024, true},
           {8192, 4096, 1024, true}, {1024, 256, 512, false}}) {
    INFO("[" << rows << ", " << K << "] x [" << K << ", " << N << "]" << (bT ? " (b^T)" : "") << " with a's column sums");
    auto g = std::make_unique<Graph>("bgrad_a");
    Value* d = g->addInput("d", TensorType(DType::bf16, {rows / 256, 256, K}));
    Value* w = g->addInput("w", TensorType(DType::bf16, bT ? Shape{N, K} : Shape{K, N}));
    g->addOutput(bf16Matmul(*g, d, w, bT), "y");
    g->addOutput(sumOverRows(*g, d), "db");
    TensorMap in = uniformInputs(*g, 37, [&](const std::string& v) { return v == "w" ? 2.0 / std::sqrt(double(K)) : 1.0; },
                                 true);
    auto [ours, cublas, unfused] = runThreeWays(*g, in, "bgrad_a", sm90);
    for (const char* name : {"y", "db"})
      checkLtAndUnfused(ours, cublas, unfused, name, "cuBLASLt's GEMM and a reduce_sum", 8e-3);
    double worst = worstColumnSum(in.at("d"), rows, K, ours.at("db"));
    WARN("db against d's column sums in double: worst " << worst << " of the allowed");
    CHECK(worst <= 1.0);
    if (rows <= 1024) checkAgainstCpu(*g, in, ours, {"y", "db"});
  }
}

// dgelu (the MLP's input gradient through gelu: g = (dy w^T) * gelu'(pre)) at the tile multiples runs our sm_90
// kernel when asked: against cuBLASLt's DGELU, the unfused GPU ops and the CPU backend, and on sampled rows
// against the product and gelu' in double at every element. Shapes as the gelu_bias case's, w^T mostly (the GPT's
// layout: the second MLP weight [4D, D]); pre spans [-5, 5], gelu' from -0.13 to 1.13, its tails included.
//
// With the bias gradient db = g's column sums (dgelu_bgrad, TPC_OWN_GEMM=dgelu_bgrad): the same kernel sums each
// warp's 16 rows in its epilogue, a second kernel those sums in order; db against cuBLASLt's DGELU and a
// reduce_sum, the unfused ops, and g's own column sums in double.
TEST_CASE("cuda epilogues: dgelu through our sm_90 GEMM kernel matches the CPU, cuBLASLt and the unfused ops",
          "[gpu][epilogue]") {
  test::requireGpuOrSkip();
  unsetenv("TPC_OWN_GEMM");
  const bool sm90 = onSm90();
  for (bool bgrad : {false, true})
  for (auto [rows, K, N, bT] : std::vector<std::tuple<int64_t, int64_t, int64_t, bool>>{
           {512, 512, 768, true}, {512, 256, 512, true}, {1024, 512, 512, false}, {8192, 256, 1280, true},
           {8192, 512, 1280, false}, {16384, 768, 3072, true}, {512, 64, 512, true}, {512, 192, 512, false},
           {1024, 576, 768, false}}) {
    INFO("[" << rows << ", " << K << "] x [" << K << ", " << N << "]" << (bT ? " (b^T)" : "") << (bgrad ? " with db" : ""));
    auto g = std::make_unique<Graph>("dgelu");
    auto T = [&](Shape s) { return TensorType(DType::bf16, std::move(s)); };
    Value* dy = g->addInput("dy", T({rows / 256, 256, K}));
    Value* w = g->addInput("w", T(bT ? Shape{N, K} : Shape{K, N}));
    Value* pre = g->addInput("pre", T({rows / 256, 256, N}));
    auto d = g->create(OpKind::GeluGrad, {bf16Matmul(*g, dy, w, bT), pre});
    REQUIRE(d.ok());
    g->addOutput((*d)->result(), "g");
    if (bgrad) g->addOutput(sumOverRows(*g, (*d)->result()), "db");
    TensorMap in = uniformInputs(
        *g, 29, [&](const std::string& v) { return v == "pre" ? 5.0 : v == "w" ? 2.0 / std::sqrt(double(K)) : 1.0; }, true);
    auto [ours, cublas, unfused] = runThreeWays(*g, in, bgrad ? "dgelu_bgrad" : "dgelu", sm90);
    if (bgrad) {
      // db: within a bf16 rounding of cuBLASLt's path and the unfused ops (the same sums in other orders), and
      // of g's column sums in double (ours g: the values summed), within a bf16 step of the sum plus 1e-5 of
      // the column's sum of |g| (f32 sums of 16 rows, then in double). A 16-row group left out or counted twice
      // moves a sum by about 4 mean |g|, past that.
      checkLtAndUnfused(ours, cublas, unfused, "db", "cuBLASLt's DGELU and a reduce_sum", 8e-3);
      double worst = worstColumnSum(ours.at("g"), rows, N, ours.at("db"));
      WARN("db against g's column sums in double: worst " << worst << " of the allowed");
      CHECK(worst <= 1.0);
    }
    double relLt = difference(ours.at("g"), cublas.at("g")), relUnfused = difference(ours.at("g"), unfused.at("g"));
    WARN("g: max difference over max value: ours vs cuBLASLt's DGELU " << relLt << ", vs the unfused ops " << relUnfused);
    // K >= 512 rounds the product to bf16 before the multiply (as the unfused ops), K 256 multiplies the f32 sum
    // (as cuBLASLt): one rounding apart from either, two at most.
    CHECK(relLt <= 8e-3);
    CHECK(relUnfused <= 1.6e-2);
    // Every 61st row in double: |ours - mm gelu'(pre)| within 2 bf16 steps of the element (the product's rounding,
    // then the result's), plus |mm| 1e-6 (gelu' in f32 near its root at -0.75, where 1 + 2cv(es)(...) cancels, is
    // good to ~2.5e-7 absolute) and 2^-15 of the largest term times |gelu'| (the f32 sum's own error where the
    // product cancels). bf16's step is 2^-8 of the element.
    const HostTensor &gv = ours.at("g"), &dyv = in.at("dy"), &wv = in.at("w"), &pv = in.at("pre");
    double worst = 0;
    int64_t checked = 0;
    for (int64_t r = 0; r < rows; r += 61)
      for (int64_t n = 0; n < N; ++n) {
        double mmv = 0, big = 0;
        for (int64_t k = 0; k < K; ++k) {
          double term = dyv.getAsDouble(r * K + k) * wv.getAsDouble(bT ? n * K + k : k * N + n);
          mmv += term;
          big = std::max(big, std::abs(term));
        }
        double p = pv.getAsDouble(r * N + n), t = std::tanh(0.7978845608028654 * (p + 0.044715 * p * p * p));
        double gp = 0.5 * (1 + t) + 0.5 * p * (1 - t * t) * 0.7978845608028654 * (1 + 3 * 0.044715 * p * p);
        double want = mmv * gp;
        double step = want == 0 ? 0.0 : std::ldexp(1.0, std::ilogb(want) - 7);
        double allowed = 2 * step + std::abs(mmv) * 1e-6 + big * std::abs(gp) * 0x1p-15;
        double diff = std::abs(gv.getAsDouble(r * N + n) - want) / std::max(allowed, 1e-38);
        worst = std::isnan(diff) ? INFINITY : std::max(worst, diff);
        ++checked;
      }
    WARN("g against (dy w^T) gelu'(pre) in double over " << checked << " elements: worst " << worst << " of the allowed");
    CHECK(worst <= 1.0);
    if (rows <= 1024 && bgrad) checkAgainstCpu(*g, in, ours, {"g", "db"});
    else if (rows <= 1024) checkAgainstCpu(*g, in, ours, {"g"});
  }
}

TEST_CASE("cuda epilogues: each cuBLASLt epilogue matches the unfused ops (fp32 1e-5, bf16 1e-2)", "[gpu][epilogue]") {
  test::requireGpuOrSkip();
  unsetenv("TPC_OWN_GEMM");  // it would override runOnce's CudaOptions::ownGemm ""
  for (DType t : {DType::f32, DType::bf16})
    for (const char* e : {"bias", "bias+residual", "gelu_bias", "dgelu", "dgelu_bgrad", "bgrad_b"}) {
      INFO(e << " " << dtypeName(t));
      auto g = unfused(e, t);
      std::mt19937 rng(11);
      TensorMap in;
      for (const Value* v : g->inputs()) {
        HostTensor x(TensorType(DType::f32, v->shape()));
        double span = v->name() == "pre" ? 3 : 1;
        for (int64_t i = 0; i < x.numel(); ++i) x.data<float>()[i] = static_cast<float>(std::uniform_real_distribution<double>(-span, span)(rng));
        in[v->name()] = x;
      }
      Outcome plain = runOnce(*g, in, false), fused = runOnce(*g, in, true);
      WARN(e << " " << dtypeName(t) << ": launches " << plain.launches << " unfused, " << fused.launches << " with the epilogue");
      CHECK(fused.launches < plain.launches);  // cuBLASLt took the epilogue
      for (auto& [name, want] : plain.out) {
        INFO(name);
        const HostTensor& got = fused.out.at(name);
        REQUIRE(got.numel() == want.numel());
        double worst = 0, scale = 0;
        for (int64_t i = 0; i < want.numel(); ++i) {
          scale = std::max(scale, std::abs(want.getAsDouble(i)));
          double d = std::abs(got.getAsDouble(i) - want.getAsDouble(i));
          worst = std::isnan(d) ? INFINITY : std::max(worst, d);
        }
        WARN(e << " " << dtypeName(t) << " " << name << ": worst difference " << worst << " of " << scale);
        CHECK(worst <= (t == DType::f32 ? 1e-5 : 1e-2) * std::max(scale, 1.0));
      }
    }
}

namespace {

// Ten training steps of g on one GPU with `o` and every epilogue kind (gpu_train_steps.h).
test::TenSteps trainTenSteps(const Graph& g, CudaOptions o) {
  o.matmulEpilogueKinds = "all";
  return test::trainTenSteps(g, o);
}

}  // namespace

TEST_CASE("cuda epilogues: a 2-layer GPT trains 10 steps to the same losses with and without them", "[gpu][epilogue]") {
  test::requireGpuOrSkip();
  for (bool bf16 : {false, true}) {
    auto g = test::fusionGptStep(bf16, true, true);
    std::vector<double> losses[2];
    int64_t launches[2] = {0, 0};
    for (int with : {0, 1}) {
      CudaOptions o;
      o.matmulEpilogues = with == 1;
      test::TenSteps run = trainTenSteps(*g, o);
      losses[with] = run.losses;
      launches[with] = run.launches;
    }
    const double worst = test::worstRelativeDifference(losses[0], losses[1]);
    WARN((bf16 ? "bf16" : "fp32") << ": losses " << losses[0].front() << " -> " << losses[0].back() << "; launches per step "
                                  << launches[0] << " without epilogues, " << launches[1] << " with; worst relative loss difference "
                                  << worst);
    CHECK(worst <= (bf16 ? 1e-2 : 1e-5));
    CHECK(launches[1] < launches[0]);
  }
}

// TPC_LN_RESIDUAL=1 (fold-layer-norm-residual): the forward residual adds move from the bias GEMMs (cuBLASLt's C
// with beta 1) into the layer_norm kernel that reads them; the same losses within bf16 rounding (the GEMM's output
// is rounded before the add, as in the unfolded graph), exactly the same launches a step (a layer_norm with two
// results is one kernel, as it was), and a bad value is one clear error.
TEST_CASE("cuda epilogues: the forward residual adds in the layer_norm kernel train a 2-layer GPT to the same losses",
          "[gpu][epilogue]") {
  test::requireGpuOrSkip();
  for (bool bf16 : {false, true}) {
    // (No dropout: with it the bias GEMM's reader is the dropout, the residual add is fused with it, and nothing folds.)
    auto g = test::fusionGptStep(bf16, false, true);
    std::vector<double> losses[2];
    int64_t launches[2] = {0, 0}, residualLayerNorms[2] = {0, 0};
    for (int with : {0, 1}) {
      setenv("TPC_LN_RESIDUAL", with ? "1" : "0", 1);
      test::TenSteps run = trainTenSteps(*g, CudaOptions{});
      losses[with] = run.losses;
      launches[with] = run.launches;
      REQUIRE(run.info);
      residualLayerNorms[with] = run.info->residualLayerNorms;
    }
    unsetenv("TPC_LN_RESIDUAL");
    CHECK(residualLayerNorms[0] == 0);
    CHECK(residualLayerNorms[1] == 4);  // 2 layers: ln_2 and the next ln_1 or ln_f
    const double worst = test::worstRelativeDifference(losses[0], losses[1]);
    WARN((bf16 ? "bf16" : "fp32") << ": losses " << losses[0].front() << " -> " << losses[0].back() << "; launches per step "
                                  << launches[0] << " with the residual in the GEMMs, " << launches[1]
                                  << " in the layer_norms; worst relative loss difference " << worst);
    CHECK(worst <= (bf16 ? 1e-2 : 1e-5));
    CHECK(launches[1] == launches[0]);
  }
  setenv("TPC_LN_RESIDUAL", "yes", 1);
  auto backend = createCudaBackend({}, CudaOptions{});
  Status st = backend->prepare(*test::fusionGptStep(false, true, true), {});
  unsetenv("TPC_LN_RESIDUAL");
  REQUIRE_FALSE(st.ok());
  CHECK(st.error().find("TPC_LN_RESIDUAL=yes") != std::string::npos);
}

// The rank programs fold other epilogues than the unsharded step (test_rewrite_for_cuda.cpp): rank 0's
// projections take the residual as C, rank 1's do not; the QKV projection stays unfused.
TEST_CASE("cuda epilogues: megatron-tp 2 on virtual ranks trains 5 steps to the same losses with and without them",
          "[gpu][epilogue]") {
  test::requireGpuOrSkip();
  GptConfig gc = test::smallGpt();
  gc.heads = 8;
  gc.paddedVocab = 128;
  gc.attentionDropout = 0.1;
  auto step = test::gptStep(gc, 4, test::megatronTp(2) + test::kTrainPasses);
  std::vector<double> losses[2];
  int64_t launches[2] = {0, 0};
  for (int with : {0, 1}) {
    std::vector<std::unique_ptr<Graph>> ranks = test::rankGraphs(*step);
    REQUIRE(ranks.size() == 2);
    for (auto& r : ranks) REQUIRE(createFusePass()->run(*r).ok());  // as tpc run: fuse each rank's program
    CudaOptions o;
    o.seed = 99;
    o.verbose = false;
    o.matmulEpilogues = with == 1;
    o.matmulEpilogueKinds = "all";
    auto backend = createCudaBackend(std::move(ranks), o);
    test::prepareInitialState(*backend, *step, 1);
    std::mt19937 rng(7);
    losses[with] = test::trainLosses(*backend, rng, 5);
    launches[with] = backend->launchesPerStep();
  }
  const double worst = test::worstRelativeDifference(losses[0], losses[1]);
  WARN("tp 2: losses " << losses[0].front() << " -> " << losses[0].back() << "; launches per step " << launches[0]
                       << " without epilogues, " << launches[1] << " with; worst relative loss difference " << worst);
  CHECK(worst <= 1e-5);
  CHECK(launches[1] < launches[0]);
}

}  // namespace tpc
