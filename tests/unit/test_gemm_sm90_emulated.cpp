// Our sm_90 GEMM kernel (runtime/cuda/kernels/gemm_sm90.cpp) run on the CPU through tests/unit/sm90_emulator.h:
// every variant the GPT uses (gelu_bias, bias, bias_residual and dgelu with pre or r copied one or three chunks ahead,
// dgelu_bgrad; b in both
// layouts; the deferred and the exact epilogue; blocks alone and in clusters of two) on random inputs against
// sums in double, with its asynchronous copies landing as early and as late as PTX allows. The same numbers are
// required bit for bit across those orders, between pre1 and pre3, and with and without clusters. Five kernels
// with a wait or a fence taken out must fail here: the check can fail. Speed and the real hardware's rounding are
// the GPU test's (test_matmul_epilogues_gpu.cpp).
#ifdef TPC_HAVE_CUDA
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <random>

#include "gemm_sm90_nodes.h"
#include "runtime/cuda/kernels/family_lowerings.h"
#include "runtime/cuda/lowering.h"
#include "runtime/host_tensor.h"
#include "cuda_emulator.h"
#include "sm90_emulator.h"
#include "test_support.h"

namespace tpc {
namespace {

using namespace cuda;
using test::Sm90Launch;

struct Case {
  std::string kind;           // gelu_bias, bias, bias_residual, dgelu, dgelu_bgrad, bgrad_a
  int64_t M, N, K;
  bool bT;                    // b given as [N, K]
  std::string how;            // added to TPC_OWN_GEMM's list: "", "pre1", "multicast"
  int64_t sms = 3;            // the persistent grid: 3 blocks (at most one a tile), so that most take several
};

// The operands (bf16 bits) and what the kernel writes.
struct Io {
  std::vector<uint16_t> a, b, third, fourth, out0, out1;  // third: bias or pre; fourth: bias_residual's r; out0: y
                                                         // or g; out1: gelu_bias's pre
  std::vector<float> colsums;  // dgelu_bgrad's [M / 16, N] partial column sums of g, bgrad_a's [M / 16, K] of a
};

std::vector<uint16_t> randomBf16(size_t n, double span, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(-span, span);
  std::vector<uint16_t> v(n);
  for (auto& x : v) x = floatToBf16(static_cast<float>(u(rng)));
  return v;
}

Io inputs(const Case& c) {
  Io io;
  io.a = randomBf16(static_cast<size_t>(c.M * c.K), 1.0, 1);
  io.b = randomBf16(static_cast<size_t>(c.K * c.N), 2.0 / std::sqrt(static_cast<double>(c.K)), 2);
  const bool biasRow = c.kind == "gelu_bias" || c.kind == "bias" || c.kind == "bias_residual";
  if (c.kind != "bgrad_a")
    io.third = biasRow ? randomBf16(static_cast<size_t>(c.N), 0.5, 3) : randomBf16(static_cast<size_t>(c.M * c.N), 5.0, 3);
  if (c.kind == "bias_residual") io.fourth = randomBf16(static_cast<size_t>(c.M * c.N), 2.0, 4);
  return io;
}

KernelSpec lower(const Case& c) {
  EpilogueNode e = epilogueNode(c.kind, {c.M, c.K}, c.bT ? Shape{c.N, c.K} : Shape{c.K, c.N}, c.bT, DType::bf16);
  LoweringContext ctx;
  ctx.numSMs = static_cast<int>(c.sms);
  REQUIRE(setOwnGemmKinds(c.how.empty() ? c.kind : c.kind + "," + c.how, "test", &ctx).ok());
  auto l = lowerGemm(*e.n, ctx);
  REQUIRE(l.ok());
  return l->kernels[0];
}

Sm90Launch compile(const KernelSpec& k, const test::TempDir& dir) {
  static int serial = 0;
  auto fn = test::compileSm90Emulated(k.source, gemmSm90Ptx(), k.entry, dir.path.string(), serial++);
  INFO((fn.ok() ? std::string() : fn.error()));
  REQUIRE(fn.ok());
  return *fn;
}

// One launch in `mode` on fresh outputs (NaN bytes, so that what the kernel does not write shows). Returns the
// emulator's complaint, or "".
std::string run(Sm90Launch fn, const KernelSpec& k, const Case& c, Io& io, int mode) {
  io.out0.assign(static_cast<size_t>(c.M * c.N), 0xFFFF);
  io.out1.assign(c.kind == "gelu_bias" ? static_cast<size_t>(c.M * c.N) : 0, 0xFFFF);
  io.colsums.assign(c.kind == "dgelu_bgrad" ? static_cast<size_t>(c.M / 16 * c.N)
                    : c.kind == "bgrad_a"   ? static_cast<size_t>(c.M / 16 * c.K)
                                            : 0,
                    std::nanf(""));
  std::vector<test::Sm90EmulatedMap> maps;
  for (const TensorMapSpec& m : k.maps) {
    const void* base = m.operand ? (m.index == 0 ? io.a.data() : io.b.data()) : (m.index == 0 ? io.out0.data() : io.out1.data());
    test::Sm90EmulatedMap e{};
    e.base = base;
    e.inner = static_cast<unsigned long long>(m.cols);
    e.outer = static_cast<unsigned long long>(m.rows);
    e.pitch = static_cast<unsigned long long>(m.cols) * 2;
    e.boxInner = m.boxCols;
    e.boxOuter = m.boxRows;
    maps.push_back(e);
  }
  const void* third = io.third.data();
  const void* fourth = io.fourth.data();
  float* ws = io.colsums.data();
  std::vector<void*> args;
  for (const KernelArg& a : k.args) {
    if (a.kind == ArgKind::TensorMap) args.push_back(&maps[static_cast<size_t>(a.index)]);
    else if (a.kind == ArgKind::Operand) args.push_back(a.index == 3 ? &fourth : &third);
    else args.push_back(&ws);
  }
  auto range = [](const auto& v) {
    return std::pair<void*, void*>{const_cast<void*>(static_cast<const void*>(v.data())),
                                   reinterpret_cast<void*>(v.size() * sizeof(v[0]))};
  };
  std::vector<void*> ranges;
  for (auto [p, n] : {range(io.a), range(io.b), range(io.third), range(io.fourth), range(io.out0), range(io.out1),
                      range(io.colsums)}) {
    ranges.push_back(p);
    ranges.push_back(n);
  }
  return fn(args.data(), k.grid.x, k.clusterX, k.block.x, k.sharedBytes, mode, ranges.data(),
            static_cast<unsigned>(ranges.size() / 2));
}

float f(uint16_t h) { return bf16ToFloat(h); }

double geluRef(double x) { return 0.5 * x * (1 + std::tanh(0.7978845608028654 * (x + 0.044715 * x * x * x))); }
double geluGradRef(double x) {
  const double u = 0.7978845608028654 * (x + 0.044715 * x * x * x), t = std::tanh(u);
  return 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * 0.7978845608028654 * (1 + 3 * 0.044715 * x * x);
}

// a b in double, [M, N].
std::vector<double> product(const Case& c, const Io& io) {
  std::vector<double> h(static_cast<size_t>(c.M * c.N), 0.0);
  for (int64_t m = 0; m < c.M; ++m)
    for (int64_t k = 0; k < c.K; ++k) {
      const double av = f(io.a[static_cast<size_t>(m * c.K + k)]);
      for (int64_t n = 0; n < c.N; ++n)
        h[static_cast<size_t>(m * c.N + n)] += av * f(io.b[static_cast<size_t>(c.bT ? n * c.K + k : k * c.N + n)]);
    }
  return h;
}

// How many of the [rows / 16, cols] sums of src's 16-row groups (bf16 [rows, cols]) are not within rel of the
// group's sum of |values| plus abs of its sum in double.
int64_t wrongRowSums(const std::vector<uint16_t>& src, int64_t rows, int64_t cols, const std::vector<float>& sums,
                     double rel, double abs) {
  int64_t bad = 0;
  for (int64_t r = 0; r < rows / 16; ++r)
    for (int64_t n = 0; n < cols; ++n) {
      double sum = 0, mag = 0;
      for (int64_t m = r * 16; m < r * 16 + 16; ++m) {
        sum += f(src[static_cast<size_t>(m * cols + n)]);
        mag += std::fabs(f(src[static_cast<size_t>(m * cols + n)]));
      }
      bad += !(std::fabs(sums[static_cast<size_t>(r * cols + n)] - sum) <= rel * mag + abs);
    }
  return bad;
}

// How many results differ from the sums in double (h = product()) by more than the kernel's roundings allow (NaN,
// an unwritten element, counts). Each rounding to bf16 is within 2^-9 of its value, and the f32 sums and the
// kernel's gelu and gelu' within ~1e-6: the bounds are those steps' errors, doubled. gelu_bias: pre = bf16(s + bias)
// and y = bf16(gelu(pre or the f32 sum)); bias: y = bf16(s + bias); bias_residual: y = bf16(bf16(s + bias) + r), or
// bf16(s + bias + r) (K < 512); dgelu: g = bf16(bf16(s) gelu'(pre)), or the f32 s unrounded (K < 512).
int64_t wrong(const Case& c, const Io& io, const std::vector<double>& h) {
  int64_t bad = 0;
  for (int64_t m = 0; m < c.M; ++m) {
    for (int64_t n = 0; n < c.N; ++n) {
      const size_t i = static_cast<size_t>(m * c.N + n);
      const double s = h[i];
      if (c.kind == "gelu_bias") {
        const double x = s + f(io.third[static_cast<size_t>(n)]), pre = f(io.out1[i]), y = f(io.out0[i]);
        bad += !(std::fabs(pre - x) <= 0x1p-8 * std::fabs(x) + 1e-6);
        bad += !(std::fabs(y - geluRef(x)) <= 0x1p-8 * (std::fabs(geluGradRef(x) * x) + std::fabs(y)) + 1e-6);
      } else if (c.kind == "bias") {
        const double x = s + f(io.third[static_cast<size_t>(n)]), y = f(io.out0[i]);
        bad += !(std::fabs(y - x) <= 0x1p-8 * std::fabs(x) + 1e-6);
      } else if (c.kind == "bgrad_a") {
        const double y = f(io.out0[i]);
        bad += !(std::fabs(y - s) <= 0x1p-8 * std::fabs(s) + 1e-6);
      } else if (c.kind == "bias_residual") {
        const double x = s + f(io.third[static_cast<size_t>(n)]), want = x + f(io.fourth[i]), y = f(io.out0[i]);
        bad += !(std::fabs(y - want) <= 0x1p-8 * (std::fabs(x) + std::fabs(want)) + 1e-6);
      } else {
        const double want = s * geluGradRef(f(io.third[i])), g = f(io.out0[i]);
        bad += !(std::fabs(g - want) <= 0x1p-8 * (std::fabs(want) + std::fabs(g)) + 1e-6 * (1 + std::fabs(s)));
      }
    }
  }
  // bgrad_a: each warp's 16 rows of a, per column of a (every k-slice's by one tile's warps); dgelu_bgrad: of the
  // stored g, per column.
  if (c.kind == "bgrad_a") bad += wrongRowSums(io.a, c.M, c.K, io.colsums, 1e-6, 1e-7);
  if (c.kind == "dgelu_bgrad") bad += wrongRowSums(io.out0, c.M, c.N, io.colsums, 1e-5, 1e-6);
  return bad;
}

bool sameBits(const Io& x, const Io& y) {
  return x.out0 == y.out0 && x.out1 == y.out1 && x.colsums.size() == y.colsums.size() &&
         std::memcmp(x.colsums.data(), y.colsums.data(), x.colsums.size() * sizeof(float)) == 0;
}

// Runs the case in both modes; both must be right and the same bits. Returns mode 0's results.
Io check(const Case& c, const test::TempDir& dir) {
  INFO(c.kind << " M " << c.M << " N " << c.N << " K " << c.K << (c.bT ? " b^T" : " b") << " " << c.how);
  KernelSpec k = lower(c);
  Sm90Launch fn = compile(k, dir);
  Io io = inputs(c), late = io;
  const std::vector<double> h = product(c, io);
  CHECK(run(fn, k, c, io, 0) == "");
  CHECK(wrong(c, io, h) == 0);
  CHECK(run(fn, k, c, late, 1) == "");
  CHECK(wrong(c, late, h) == 0);
  CHECK(sameBits(io, late));
  return io;
}

}  // namespace

TEST_CASE("gemm sm90 emulated: gelu_bias, bias, bias_residual, dgelu, dgelu_bgrad and bgrad_a against double, in both orders",
          "[cuda][emulator]") {
  test::TempDir dir;
  // gelu_bias: b [K, N] (N-major tiles), the deferred epilogue over 8 tiles; b^T and the exact epilogue (K < 512).
  check({"gelu_bias", 512, 512, 512, false, ""}, dir);
  check({"gelu_bias", 256, 512, 256, true, ""}, dir);
  // dgelu as the GPT has it (b^T, deferred), pre three chunks ahead and one: the same bits.
  Case d{"dgelu", 512, 512, 512, true, ""};
  Io pre3 = check(d, dir);
  d.how = "pre1";
  CHECK(sameBits(pre3, check(d, dir)));
  // dgelu with b [K, N], K 192 (fewer k-slices than the ring's stages; the exact epilogue); dgelu_bgrad, K 576 (a
  // tail that starts mid-ring).
  check({"dgelu", 256, 512, 192, false, ""}, dir);
  check({"dgelu_bgrad", 512, 256, 576, true, ""}, dir);
  check({"dgelu_bgrad", 256, 256, 256, true, "pre1"}, dir);
  // The deferred epilogue spread over more k-slices than its 8 chunks: a chunk every second one (K 1024), and at
  // k-slices 0, 1, 3, 4, 6, 7, 9, 10 of 12 (K 768, gpt2's).
  check({"dgelu", 256, 512, 1024, true, ""}, dir);
  check({"gelu_bias", 256, 512, 768, false, ""}, dir);
  // bias (c_attn): the deferred stores over K 768's k-slices, the exact epilogue (K 256) with b and b^T.
  check({"bias", 512, 512, 768, false, ""}, dir);
  check({"bias", 256, 512, 256, false, ""}, dir);
  check({"bias", 256, 512, 256, true, ""}, dir);
  // bias_residual (the attention projection, c_proj): r copied three chunks ahead and one, the same bits, over K
  // 1024's k-slices (gpt2-medium's projection); the exact epilogue (K 256) with b^T.
  Case r{"bias_residual", 512, 256, 1024, false, ""};
  Io r3 = check(r, dir);
  r.how = "pre1";
  CHECK(sameBits(r3, check(r, dir)));
  check({"bias_residual", 256, 512, 256, true, ""}, dir);
  // bgrad_a (c_attn's and c_fc's input gradients, b^T): k-slices shared out over 2 column tiles (N 512) with the
  // deferred epilogue, over 3 (N 768, gpt2's) with K 576's 9 k-slices (tile 0 sums 3, tiles 1 and 2 3 each), and
  // the exact epilogue with b [K, N] and more column tiles (4) than k-slices (K 192: 3).
  check({"bgrad_a", 256, 512, 768, true, ""}, dir);
  check({"bgrad_a", 256, 768, 576, true, ""}, dir);
  check({"bgrad_a", 256, 1024, 192, false, ""}, dir);
}

TEST_CASE("gemm sm90 emulated: blocks in clusters of two give the same bits", "[cuda][emulator]") {
  test::TempDir dir;
  for (Case c : {Case{"gelu_bias", 512, 512, 512, false, ""}, Case{"bias", 512, 512, 512, true, ""},
                 Case{"dgelu", 512, 512, 512, true, ""}, Case{"bias_residual", 512, 256, 512, false, ""},
                 Case{"bgrad_a", 512, 512, 512, true, ""}}) {
    Io alone = check(c, dir);
    c.how = "multicast";
    c.sms = 4;  // two clusters
    KernelSpec k = lower(c);
    CHECK(k.clusterX == 2);
    CHECK(sameBits(alone, check(c, dir)));
  }
}

TEST_CASE("gemm sm90 emulated: a kernel with a wait or fence taken out is caught", "[cuda][emulator]") {
  test::TempDir dir;
  struct Mutation {
    const char *what, *from, *to;
    int mode;           // the order that shows it
    const char* says;   // what the emulator reports, or nullptr: the numbers are wrong
  };
  const Mutation mutations[] = {
      // A stage handed back to the producer while the k-slice before is still reading it.
      {"stage released early", "wgmma_wait<1>();", "wgmma_wait<2>();", 0, nullptr},
      // The out slot reused before the previous chunk's TMA store has read it (pre3's single out slot).
      {"out slot reused early", "else bulk_wait_read<0>();", "else bulk_wait_read<1>();", 0, nullptr},
      // Chunks 3-7's pre read while the copy issued right after theirs may still be pending (chunks 0-2 unchanged).
      {"pre read early", "drain && 7 - c < 2 ? 7 - c : 2)", "drain && 8 - c < 3 ? 8 - c : 4)", 1, nullptr},
      // The staging slot's fragment writes not fenced for the TMA store's async proxy.
      {"store unfenced", "      fence_proxy_async();                                 // generic-proxy writes -> visible to TMA",
       "", 1, "without fence.proxy.async"},
      // The block's shared memory released while its last TMA stores may still read it.
      {"exit before the stores", "if (lane == 0) bulk_wait_all();", "", 0, "TMA store"},
  };
  const Case c{"dgelu", 512, 512, 512, true, ""};
  const Io in = inputs(c);
  const std::vector<double> h = product(c, in);
  for (const Mutation& mu : mutations) {
    INFO(mu.what);
    KernelSpec k = lower(c);
    const size_t at = k.source.find(mu.from);
    REQUIRE(at != std::string::npos);
    REQUIRE(k.source.find(mu.from, at + 1) == std::string::npos);
    k.source.replace(at, std::strlen(mu.from), mu.to);
    Sm90Launch fn = compile(k, dir);
    Io io = in;
    const std::string complaint = run(fn, k, c, io, mu.mode);
    const int64_t bad = wrong(c, io, h);
    UNSCOPED_INFO(mu.what << ": " << bad << " wrong elements; the emulator says '" << complaint << "'");
    if (mu.says) CHECK(complaint.find(mu.says) != std::string::npos);
    else CHECK(bad > 0);
  }
}

// The column kernel after dgelu_bgrad's and bgrad_a's GEMM: db[c] = the [M / 16, cols] f32 partials' column sums in
// tpc_column_sum's order (row group y = p mod 32 summed in p order, then the groups in y order, in double), rounded
// once. Its launch (the columns a block) must not change that order: bit for bit.
TEST_CASE("gemm sm90 emulated: the column kernels sum the 16-row partials in their fixed order", "[cuda][emulator]") {
  test::TempDir dir;
  int serial = 0;
  // M 16640: 1040 partial rows, so the 512-row strides of the sum end in a partial one; cols 768 and 200 (a tail).
  for (const Case& c : {Case{"bgrad_a", 16640, 256, 768, true, ""}, Case{"dgelu_bgrad", 16640, 768, 256, true, ""},
                        Case{"bgrad_a", 2048, 256, 200, true, ""}}) {
    INFO(c.kind << " M " << c.M << " N " << c.N << " K " << c.K);
    EpilogueNode e = epilogueNode(c.kind, {c.M, c.K}, Shape{c.N, c.K}, true, DType::bf16);
    LoweringContext ctx;
    ctx.numSMs = 132;
    REQUIRE(setOwnGemmKinds(c.kind, "test", &ctx).ok());
    auto l = lowerGemm(*e.n, ctx);
    if (c.K == 200) {  // K 200 is off the kernel's tile: no column kernel to run
      CHECK_FALSE(l.ok());
      continue;
    }
    REQUIRE(l.ok());
    REQUIRE(l->kernels.size() == 2);
    const KernelSpec& k = l->kernels[1];
    const int64_t P = c.M / 16, cols = c.kind == "bgrad_a" ? c.K : c.N;
    CHECK(k.grid.x * k.block.x >= cols);
    std::vector<float> part(static_cast<size_t>(P * cols));
    std::mt19937 rng(7);
    std::normal_distribution<float> nd(0.f, 1.f);
    for (float& v : part) v = nd(rng) * 100.f;
    // A +2^80 and a -2^80 in each column: the double sum swallows whichever small terms meet them first, so
    // another order gives other bits (checked below: a plain p-order sum differs in most columns).
    for (int64_t col = 0; col < cols; ++col) {
      part[static_cast<size_t>((col % P) * cols + col)] = 0x1p80f;
      part[static_cast<size_t>(((col * 7 + 3) % P) * cols + col)] = -0x1p80f;
    }
    const DType dbType = e.n->result(1)->dtype();
    REQUIRE((dbType == DType::bf16 || dbType == DType::f32));
    std::vector<uint16_t> db16(static_cast<size_t>(cols), 0xFFFF);
    std::vector<float> db32(static_cast<size_t>(cols), -1.f);
    void* partPtr = part.data();
    void* dbPtr = dbType == DType::bf16 ? static_cast<void*>(db16.data()) : static_cast<void*>(db32.data());
    void* args[] = {&partPtr, &dbPtr};
    auto fn = test::compileEmulated(k.source, k.entry, dir.path.string(), serial++);
    INFO((fn.ok() ? std::string() : fn.error()));
    REQUIRE(fn.ok());
    (*fn)(args, k.grid.x, k.grid.y, k.grid.z, k.block.x, k.block.y, k.block.z, k.sharedBytes);
    int wrongBits = 0, otherOrderDiffers = 0;
    for (int64_t col = 0; col < cols; ++col) {
      double plain = 0;
      for (int64_t p = 0; p < P; ++p) plain += part[static_cast<size_t>(p * cols + col)];
      double total = 0;
      for (int64_t y = 0; y < 32; ++y) {
        double acc = 0;
        for (int64_t p = y; p < P; p += 32) acc += part[static_cast<size_t>(p * cols + col)];
        total = y == 0 ? acc : total + acc;
      }
      const float want = static_cast<float>(total);
      otherOrderDiffers += static_cast<float>(plain) != want ? 1 : 0;
      const bool same = dbType == DType::bf16 ? db16[static_cast<size_t>(col)] == floatToBf16(want)
                                             : std::memcmp(&db32[static_cast<size_t>(col)], &want, 4) == 0;
      wrongBits += same ? 0 : 1;
    }
    CHECK(wrongBits == 0);
    CHECK(otherOrderDiffers > cols / 2);
  }
}

}  // namespace tpc
#endif
