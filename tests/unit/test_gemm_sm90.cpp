// Our sm_90 GEMM kernel for matmul_epilogue (runtime/cuda/kernels/gemm_sm90.cpp) without a
// GPU: which nodes it takes (else cuBLASLt), its switch, its launch geometry and TMA descriptors, and that its
// source compiles with NVRTC for sm_90a. Its numbers against the unfused ops are the GPU test's
// (test_matmul_epilogues_gpu.cpp).
#ifdef TPC_HAVE_CUDA
#include <catch2/catch.hpp>

#include "gemm_sm90_nodes.h"
#include "gpt_step_support.h"
#include "runtime/cuda/kernels/family_lowerings.h"
#include "runtime/cuda/lowering.h"
#include "runtime/cuda/nvrtc_compiler.h"
#include "test_support.h"

namespace tpc {
namespace {

using namespace cuda;

// The MLP's backward through gelu is a = dy, b^T = the second weight [4D, D].
EpilogueNode dgelu(Shape a, Shape b, bool transposeB, DType t = DType::bf16) {
  return epilogueNode("dgelu", std::move(a), std::move(b), transposeB, t);
}

// ptxas's report for a kernel: 168 registers at entry (40 x 128 + 232 x 256 over 384 threads; ptxas reports that
// count either way) and no stack or spills. The spill check is what catches a dropped setmaxnreg split: a trap in
// the consumers' code once made ptxas compile the consumers at 168 too, and the deferred epilogue spilled.
void checkNoSpills(NvrtcCompiler& nvrtc, const KernelSpec& k) {
  auto report = nvrtc.ptxasReport(k.source, k.entry, true);
  INFO((report.ok() ? *report : report.error()));
  REQUIRE(report.ok());
  CHECK(report->find("Used 168 registers") != std::string::npos);
  CHECK(report->find(" 0 bytes spill stores, 0 bytes spill loads") != std::string::npos);
  CHECK(report->find(" 0 bytes stack frame") != std::string::npos);
}

void checkMap(const KernelSpec& ks, size_t i, bool operand, int64_t index, int64_t rows, int64_t cols, uint32_t boxRows) {
  const TensorMapSpec& m = ks.maps[i];
  INFO("map " << i);
  CHECK(m.operand == operand);
  CHECK(m.index == index);
  CHECK(m.rows == rows);
  CHECK(m.cols == cols);
  CHECK(m.boxRows == boxRows);
  CHECK(m.boxCols == 64);
}

// `kind`'s deferred (K 768) and exact (K 256) epilogues, [1024, K] x [K, 512], the deferred one with b^T or b
// [K, N] (deferredBT; the exact one the other way), compiled for sm_90a without spills, and a column kernel where
// the lowering has one.
void checkVariantsCompile(const std::string& kind, const LoweringContext& ctx, bool deferredBT) {
  test::TempDir cache;
  NvrtcCompiler nvrtc(90, cache.path.string());
  for (int64_t K : {768, 256}) {
    const bool bT = (K == 768) == deferredBT;
    INFO("K " << K << (bT ? " b^T" : ""));
    EpilogueNode g = epilogueNode(kind, {1024, K}, bT ? Shape{512, K} : Shape{K, 512}, bT, DType::bf16);
    auto lg = lowerGemm(*g.n, ctx);
    REQUIRE(lg.ok());
    auto cubin = nvrtc.compile(lg->kernels[0].source, lg->kernels[0].entry, true);
    INFO((cubin.ok() ? std::string() : cubin.error()));
    REQUIRE(cubin.ok());
    checkNoSpills(nvrtc, lg->kernels[0]);
    if (lg->kernels.size() < 2) continue;
    auto colCubin = nvrtc.compile(lg->kernels[1].source, lg->kernels[1].entry);
    INFO((colCubin.ok() ? std::string() : colCubin.error()));
    CHECK(colCubin.ok());
  }
}

}  // namespace

TEST_CASE("gemm sm90: gelu_bias takes our kernel at the tile multiples on sm_90 only", "[cuda]") {
  LoweringContext ctx;  // sm_90, 227 KiB of shared memory a block
  CHECK_FALSE(ownGemm(*geluBias({16, 1024, 768}, {768, 3072}).n, ctx));  // off unless asked for
  ctx.ownGeluGemm = true;
  CHECK(ownGemm(*geluBias({16, 1024, 768}, {768, 3072}).n, ctx));   // gpt2's c_fc
  CHECK(ownGemm(*geluBias({16, 1024, 1024}, {1024, 4096}).n, ctx)); // gpt2-medium's
  CHECK(ownGemm(*geluBias({512, 512}, {512, 256}).n, ctx));
  CHECK(ownGemm(*geluBias({1024, 768}, {3072, 768}, DType::bf16, true).n, ctx));  // b^T: K-major tiles of b
  CHECK(ownGemm(*geluBias({1024, 256}, {256, 3072}).n, ctx));  // K < 512: the epilogue after each tile's mainloop
  // Not: N, M or K off the tile multiples, f32.
  CHECK_FALSE(ownGemm(*geluBias({16, 1024, 768}, {768, 384}).n, ctx));
  CHECK_FALSE(ownGemm(*geluBias({100, 768}, {768, 3072}).n, ctx));
  CHECK_FALSE(ownGemm(*geluBias({1024, 800}, {800, 3072}).n, ctx));
  CHECK_FALSE(ownGemm(*geluBias({1024, 768}, {768, 3072}, DType::f32).n, ctx));
  // Not on another architecture, without the shared memory, or switched off.
  EpilogueNode ok = geluBias({1024, 768}, {768, 3072});
  LoweringContext other = ctx;
  other.smMajor = 10;
  CHECK_FALSE(ownGemm(*ok.n, other));
  other = ctx;
  other.smMinor = 9;
  CHECK_FALSE(ownGemm(*ok.n, other));
  other = ctx;
  other.maxSharedBytes = 100 * 1024;
  CHECK_FALSE(ownGemm(*ok.n, other));
  other = ctx;
  other.ownGeluGemm = false;
  CHECK_FALSE(ownGemm(*ok.n, other));
}

TEST_CASE("gemm sm90: the gelu_bias kernel's geometry, TMA descriptors, and its NVRTC compile for sm_90a", "[cuda]") {
  LoweringContext ctx;
  ctx.ownGeluGemm = true;
  ctx.numSMs = 132;
  EpilogueNode c = geluBias({16, 1024, 768}, {768, 3072});
  auto l = lowerGemm(*c.n, ctx);
  REQUIRE(l.ok());
  REQUIRE(l->kernels.size() == 1);
  const KernelSpec& k = l->kernels[0];
  CHECK(k.archSpecific);
  CHECK(k.requiredRegisters == 168);  // the setmaxnreg split 40 / 232 over 128 + 256 threads
  CHECK(k.grid.x == 132);  // persistent: one block a SM over 16384/128 x 3072/256 = 1536 tiles
  CHECK(k.block.x == 384);
  CHECK(k.clusterX == 1);  // unless multicast is asked for
  CHECK(k.source.find("#define GM_CLUSTER 1") != std::string::npos);
  // gelu_bias reads no pre: the same source whether or not pre1 is asked for.
  CHECK(k.source.find("#define GM_PRE_AHEAD 1\n") != std::string::npos);
  ctx.ownGemmPreAhead = 1;
  auto l1 = lowerGemm(*c.n, ctx);
  REQUIRE(l1.ok());
  CHECK(l1->kernels[0].source == k.source);
  ctx.ownGemmPreAhead = 3;
  // Arguments in the kernel's order: the descriptors of a, b, y, pre, then the bias's address.
  REQUIRE(k.args.size() == 5);
  for (int i = 0; i < 4; ++i) CHECK((k.args[i].kind == ArgKind::TensorMap && k.args[i].index == i));
  CHECK((k.args[4].kind == ArgKind::Operand && k.args[4].index == 2));
  // a, b, y, pre as their row-major 2-D views, in [rows, 64]-column boxes (one 128-byte swizzle row).
  REQUIRE(k.maps.size() == 4);
  auto map = checkMap;
  map(k, 0, true, 0, 16384, 768, 128);
  map(k, 1, true, 1, 768, 3072, 64);  // b [K, N]: 64 k-rows of 64 n a box, four a 256-wide tile
  map(k, 2, false, 0, 16384, 3072, 8);
  map(k, 3, false, 1, 16384, 3072, 8);
  CHECK(k.source.find("#define GM_MODE 2") != std::string::npos);  // K >= 512: the deferred epilogue
  CHECK(k.source.find("#define GM_B_KMAJOR 0") != std::string::npos);
  CHECK(k.source.find("#define GM_EPI 1") != std::string::npos);
  CHECK(k.entry == "gemm_gelu_kernel");
  // A node it does not take is an error naming why, not a wrong kernel.
  EpilogueNode off = geluBias({1024, 768}, {768, 384});
  auto bad = lowerGemm(*off.n, ctx);
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.error().find("256") != std::string::npos);

  // Every variant compiles: b [K, N] or b^T [N, K] (K-major tiles of 256 n-rows), K under 512 (the epilogue
  // after each tile) or not.
  test::TempDir cache;
  NvrtcCompiler nvrtc(90, cache.path.string());
  for (auto [K, bT] : std::vector<std::pair<int64_t, bool>>{{768, false}, {256, false}, {512, true}, {256, true}}) {
    INFO("K " << K << (bT ? " b^T" : ""));
    EpilogueNode g = bT ? geluBias({1024, K}, {512, K}, DType::bf16, true) : geluBias({1024, K}, {K, 512});
    auto lg = lowerGemm(*g.n, ctx);
    REQUIRE(lg.ok());
    const KernelSpec& kg = lg->kernels[0];
    CHECK(kg.grid.x == 16);  // 8 x 2 tiles: fewer than SMs
    CHECK(kg.source.find(K >= 512 ? "#define GM_MODE 2" : "#define GM_MODE 1") != std::string::npos);
    CHECK(kg.source.find("#define GM_EPI 1") != std::string::npos);
    CHECK(kg.source.find(bT ? "#define GM_B_KMAJOR 1" : "#define GM_B_KMAJOR 0") != std::string::npos);
    if (bT) map(kg, 1, true, 1, 512, K, 256);  // b^T [N, K]: 256 n-rows of 64 k a box
    else map(kg, 1, true, 1, K, 512, 64);
    auto cubin = nvrtc.compile(kg.source, kg.entry, true);
    INFO((cubin.ok() ? std::string() : cubin.error()));
    REQUIRE(cubin.ok());
    CHECK(!cubin->empty());
    checkNoSpills(nvrtc, kg);
  }
}

TEST_CASE("gemm sm90: dgelu takes our kernel at the tile multiples when switched on, as (a, b, pre) -> g", "[cuda]") {
  LoweringContext ctx;
  CHECK_FALSE(ownGemm(*dgelu({16, 1024, 768}, {3072, 768}, true).n, ctx));  // off unless asked for
  ctx.ownGeluGemm = true;
  CHECK_FALSE(ownGemm(*dgelu({16, 1024, 768}, {3072, 768}, true).n, ctx));  // gelu_bias's switch is not dgelu's
  ctx.ownDgeluGemm = true;
  CHECK(ownGemm(*dgelu({16, 1024, 768}, {3072, 768}, true).n, ctx));    // gpt2's c_proj input gradient
  CHECK(ownGemm(*dgelu({16, 1024, 1024}, {4096, 1024}, true).n, ctx));  // gpt2-medium's
  CHECK(ownGemm(*dgelu({1024, 512}, {512, 768}, false).n, ctx));          // b [K, N]
  CHECK(ownGemm(*dgelu({1024, 256}, {512, 256}, true).n, ctx));           // K < 512
  // Not: off the tile multiples, f32.
  CHECK_FALSE(ownGemm(*dgelu({16, 1024, 768}, {384, 768}, true).n, ctx));
  CHECK_FALSE(ownGemm(*dgelu({100, 768}, {3072, 768}, true).n, ctx));
  CHECK_FALSE(ownGemm(*dgelu({1024, 768}, {3072, 768}, true, DType::f32).n, ctx));
  ctx.ownGeluGemm = false;  // and the other way round
  CHECK(ownGemm(*dgelu({1024, 768}, {3072, 768}, true).n, ctx));
  CHECK_FALSE(ownGemm(*geluBias({1024, 768}, {768, 3072}).n, ctx));
}

// bias (c_attn's y = a b + bias, no residual) when switched on: one output, its descriptors, and two variants
// compiled without spills (the deferred epilogue with b [K, N], the exact one with b^T; the emulated test runs all).
TEST_CASE("gemm sm90: bias takes our kernel when switched on, as (a, b, bias) -> y, and compiles", "[cuda]") {
  auto bias = [](Shape a, Shape b, bool bT = false, DType t = DType::bf16) {
    return epilogueNode("bias", std::move(a), std::move(b), bT, t);
  };
  LoweringContext ctx;
  ctx.numSMs = 132;
  CHECK_FALSE(ownGemm(*bias({16, 1024, 768}, {768, 2304}).n, ctx));  // off unless asked for
  ctx.ownGeluGemm = true;
  CHECK_FALSE(ownGemm(*bias({16, 1024, 768}, {768, 2304}).n, ctx));  // gelu_bias's switch is not bias's
  ctx.ownBiasGemm = true;
  CHECK(ownGemm(*bias({16, 1024, 768}, {768, 2304}).n, ctx));     // gpt2's c_attn
  CHECK(ownGemm(*bias({16, 1024, 1024}, {1024, 3072}).n, ctx));   // gpt2-medium's
  CHECK(ownGemm(*bias({1024, 512}, {768, 512}, true).n, ctx));     // b^T
  CHECK_FALSE(ownGemm(*bias({16, 1024, 768}, {768, 768 + 64}).n, ctx));  // N off the tile
  CHECK_FALSE(ownGemm(*bias({1024, 768}, {768, 2304}, false, DType::f32).n, ctx));
  EpilogueNode c = bias({16, 1024, 1024}, {1024, 3072});
  auto l = lowerGemm(*c.n, ctx);
  REQUIRE(l.ok());
  REQUIRE(l->kernels.size() == 1);
  const KernelSpec& k = l->kernels[0];
  CHECK(k.entry == "gemm_bias_kernel");
  CHECK(k.source.find("#define GM_EPI 4") != std::string::npos);
  CHECK(k.source.find("#define GM_PRE_AHEAD 1\n") != std::string::npos);  // no pre
  // The descriptors of a, b, y, then the bias's address.
  REQUIRE(k.args.size() == 4);
  for (int i = 0; i < 3; ++i) CHECK((k.args[i].kind == ArgKind::TensorMap && k.args[i].index == i));
  CHECK((k.args[3].kind == ArgKind::Operand && k.args[3].index == 2));
  REQUIRE(k.maps.size() == 3);
  checkMap(k, 2, false, 0, 16384, 3072, 8);
  checkVariantsCompile("bias", ctx, false);
}

// bias_residual (the attention projection's and c_proj's y = a b + bias + r) when switched on: bias's switch is not
// its, nor its bias's; the residual is read as dgelu reads pre (copied 3 chunks ahead, or 1 with pre1); its
// arguments; and the deferred and the exact epilogue compiled without spills.
TEST_CASE("gemm sm90: bias_residual takes our kernel when switched on, as (a, b, bias, r) -> y, and compiles", "[cuda]") {
  auto residual = [](Shape a, Shape b, bool bT = false, DType t = DType::bf16) {
    return epilogueNode("bias_residual", std::move(a), std::move(b), bT, t);
  };
  LoweringContext ctx;
  ctx.numSMs = 132;
  CHECK_FALSE(ownGemm(*residual({16, 1024, 768}, {768, 768}).n, ctx));  // off unless asked for
  ctx.ownBiasGemm = true;
  CHECK_FALSE(ownGemm(*residual({16, 1024, 768}, {768, 768}).n, ctx));  // bias's switch is not bias_residual's
  ctx.ownBiasResidualGemm = true;
  CHECK(ownGemm(*residual({16, 1024, 768}, {768, 768}).n, ctx));     // gpt2's attention projection
  CHECK(ownGemm(*residual({16, 1024, 3072}, {3072, 768}).n, ctx));   // gpt2's c_proj
  CHECK(ownGemm(*residual({16, 1024, 1024}, {1024, 1024}).n, ctx));  // gpt2-medium's
  CHECK(ownGemm(*residual({1024, 256}, {512, 256}, true).n, ctx));   // b^T, K < 512
  CHECK_FALSE(ownGemm(*residual({16, 1024, 768}, {768, 768 + 64}).n, ctx));  // N off the tile
  CHECK_FALSE(ownGemm(*residual({1024, 768}, {768, 768}, false, DType::f32).n, ctx));
  ctx.ownBiasGemm = false;
  CHECK(ownGemm(*residual({16, 1024, 768}, {768, 768}).n, ctx));
  CHECK_FALSE(ownGemm(*epilogueNode("bias", {16, 1024, 768}, {768, 2304}, false, DType::bf16).n, ctx));
  EpilogueNode c = residual({16, 1024, 1024}, {1024, 1024});
  auto l = lowerGemm(*c.n, ctx);
  REQUIRE(l.ok());
  REQUIRE(l->kernels.size() == 1);
  const KernelSpec& k = l->kernels[0];
  CHECK(k.entry == "gemm_bias_residual_kernel");
  CHECK(k.source.find("#define GM_EPI 5") != std::string::npos);
  CHECK(k.source.find("#define GM_MODE 2") != std::string::npos);          // K 1024: the deferred epilogue
  CHECK(k.source.find("#define GM_PRE_AHEAD 3\n") != std::string::npos);  // r copied as dgelu's pre
  // The descriptors of a, b, y, then the bias's and the residual's addresses.
  REQUIRE(k.args.size() == 5);
  for (int i = 0; i < 3; ++i) CHECK((k.args[i].kind == ArgKind::TensorMap && k.args[i].index == i));
  CHECK((k.args[3].kind == ArgKind::Operand && k.args[3].index == 2));
  CHECK((k.args[4].kind == ArgKind::Operand && k.args[4].index == 3));
  REQUIRE(k.maps.size() == 3);
  checkMap(k, 2, false, 0, 16384, 1024, 8);
  LoweringContext pre1 = ctx;
  REQUIRE(setOwnGemmKinds("bias_residual,pre1", "TPC_OWN_GEMM", &pre1).ok());
  auto l1 = lowerGemm(*c.n, pre1);
  REQUIRE(l1.ok());
  CHECK(l1->kernels[0].source.find("#define GM_PRE_AHEAD 1\n") != std::string::npos);
  checkVariantsCompile("bias_residual", ctx, false);
}

// bgrad_a (an input gradient d w^T and d's column sums, the bias gradient: c_attn's and c_fc's dgrad GEMMs) when
// switched on: (a, b) -> (y, db) with db one value a column of a; its workspace of 16-row partial sums [M / 16, K]
// and the column kernel over them; no pre, no bias; the deferred and the exact epilogue compiled without spills.
TEST_CASE("gemm sm90: bgrad_a takes our kernel when switched on, as (a, b) -> (y, db), and compiles", "[cuda]") {
  auto bgradA = [](Shape a, Shape b, bool bT = true, DType t = DType::bf16) {
    return epilogueNode("bgrad_a", std::move(a), std::move(b), bT, t);
  };
  LoweringContext ctx;
  ctx.numSMs = 132;
  CHECK_FALSE(ownGemm(*bgradA({16, 1024, 3072}, {1024, 3072}).n, ctx));  // off unless asked for
  ctx.ownDgeluBgradGemm = true;
  CHECK_FALSE(ownGemm(*bgradA({16, 1024, 3072}, {1024, 3072}).n, ctx));  // dgelu_bgrad's switch is not bgrad_a's
  ctx.ownBgradAGemm = true;
  CHECK(ownGemm(*bgradA({16, 1024, 3072}, {1024, 3072}).n, ctx));  // gpt2-medium's c_attn input gradient
  CHECK(ownGemm(*bgradA({16, 1024, 4096}, {1024, 4096}).n, ctx));  // and c_fc's
  CHECK(ownGemm(*bgradA({16, 1024, 2304}, {768, 2304}).n, ctx));   // gpt2's c_attn (3 column tiles)
  CHECK(ownGemm(*bgradA({1024, 512}, {512, 768}, false).n, ctx));  // b [K, N]
  CHECK_FALSE(ownGemm(*bgradA({16, 1024, 2304}, {384, 2304}).n, ctx));  // N 384: off the tile
  CHECK_FALSE(ownGemm(*bgradA({1024, 3072}, {1024, 3072}, true, DType::f32).n, ctx));
  EpilogueNode c = bgradA({16, 1024, 3072}, {1024, 3072});
  auto l = lowerGemm(*c.n, ctx);
  REQUIRE(l.ok());
  REQUIRE(l->kernels.size() == 2);
  CHECK(l->workspaceBytes == 16384 / 16 * 3072 * 4);
  const KernelSpec& k = l->kernels[0];
  CHECK(k.entry == "gemm_bgrad_a_kernel");
  CHECK(k.source.find("#define GM_EPI 6") != std::string::npos);
  CHECK(k.source.find("#define GM_PRE_AHEAD 1\n") != std::string::npos);  // no pre
  // The descriptors of a, b and y, then the partials' address (the workspace).
  REQUIRE(k.args.size() == 4);
  for (int i = 0; i < 3; ++i) CHECK((k.args[i].kind == ArgKind::TensorMap && k.args[i].index == i));
  CHECK((k.args[3].kind == ArgKind::Workspace && k.args[3].index == 0));
  REQUIRE(k.maps.size() == 3);
  checkMap(k, 2, false, 0, 16384, 1024, 8);
  const KernelSpec& cols = l->kernels[1];
  CHECK(cols.entry == "tpc_bgrad_a_columns");
  CHECK(cols.grid.x == 3072 / 32);  // one column of db a thread: K of them
  CHECK((cols.block.x == 32 && cols.block.y == 32));
  REQUIRE(cols.args.size() == 2);
  CHECK((cols.args[0].kind == ArgKind::Workspace && cols.args[0].index == 0));
  CHECK((cols.args[1].kind == ArgKind::Result && cols.args[1].index == 1));
  checkVariantsCompile("bgrad_a", ctx, true);
}

TEST_CASE("gemm sm90: the switch takes 0, or a list of 1, all, kinds and multicast, and names a wrong one", "[cuda]") {
  auto kinds = [](const std::string& s) {
    LoweringContext ctx;
    ctx.ownGeluGemm = ctx.ownBiasGemm = ctx.ownBiasResidualGemm = ctx.ownDgeluGemm = ctx.ownDgeluBgradGemm = true;
    ctx.ownBgradAGemm = ctx.ownGemmMulticast = true;  // every call sets all
    Status st = setOwnGemmKinds(s, "TPC_OWN_GEMM", &ctx);
    return st.ok() ? cat(int(ctx.ownGeluGemm), int(ctx.ownBiasGemm), int(ctx.ownBiasResidualGemm), int(ctx.ownDgeluGemm),
                         int(ctx.ownDgeluBgradGemm), int(ctx.ownBgradAGemm), int(ctx.ownGemmMulticast))
                   : st.error();
  };
  CHECK(kinds("") == "0000000");
  CHECK(kinds("0") == "0000000");
  CHECK(kinds("1") == "1111110");
  CHECK(kinds("all") == "1111110");
  CHECK(kinds("gelu_bias") == "1000000");
  CHECK(kinds("bias") == "0100000");
  CHECK(kinds("dgelu") == "0001000");
  CHECK(kinds("dgelu_bgrad") == "0000100");
  CHECK(kinds("dgelu,gelu_bias") == "1001000");
  CHECK(kinds("gelu_bias,bias") == "1100000");
  CHECK(kinds("bias_residual") == "0010000");
  CHECK(kinds("bgrad_a") == "0000010");
  CHECK(kinds("bgrad_a,multicast") == "0000011");
  CHECK(kinds("gelu_bias,bias_residual,bias") == "1110000");
  CHECK(kinds("all,multicast") == "1111111");
  CHECK(kinds("multicast,1") == "1111111");
  CHECK(kinds("dgelu,multicast") == "0001001");
  CHECK(kinds("bias,multicast") == "0100001");
  CHECK(kinds("dgelu_bgrad,multicast") == "0000101");
  std::string bad = kinds("gelu_bias,gelu");
  CHECK(bad.find("TPC_OWN_GEMM='gelu_bias,gelu'") != std::string::npos);
  CHECK(bad.find("'gelu' is not a kind") != std::string::npos);
  CHECK(kinds("dgelu,").find("'' is not a kind") != std::string::npos);
  CHECK(kinds("0,dgelu").find("'0' is not a kind") != std::string::npos);
  // multicast alone runs nothing: an error, not a silent no-op.
  CHECK(kinds("multicast").find("name one too") != std::string::npos);
  // pre1: dgelu's pre copied one chunk ahead (3 otherwise), with a kind only; every call resets it.
  LoweringContext ctx;
  REQUIRE(setOwnGemmKinds("dgelu,pre1", "TPC_OWN_GEMM", &ctx).ok());
  CHECK(ctx.ownGemmPreAhead == 1);
  CHECK(ctx.ownDgeluGemm);
  REQUIRE(setOwnGemmKinds("dgelu", "TPC_OWN_GEMM", &ctx).ok());
  CHECK(ctx.ownGemmPreAhead == 3);
  CHECK(kinds("pre1").find("name one too") != std::string::npos);
  CHECK(kinds("all,pre2").find("'pre2' is not a kind") != std::string::npos);
}

// With multicast, blocks run in clusters of two on tiles m and m + 1 of one n: an even grid, the cluster width
// for the loader, b^T's boxes of 128 n-rows (each block loads half of the 256-row tile), and every variant
// compiles for sm_90a without spills. An odd count of 128-row tiles runs without clusters.
TEST_CASE("gemm sm90: multicast runs both kinds in clusters of two where the row tiles pair up", "[cuda]") {
  LoweringContext ctx;
  ctx.numSMs = 132;
  REQUIRE(setOwnGemmKinds("all,multicast", "TPC_OWN_GEMM", &ctx).ok());
  test::TempDir cache;
  NvrtcCompiler nvrtc(90, cache.path.string());
  struct Case {
    std::string kind;
    int64_t rows, K, N;
    bool bT;
  };
  for (const Case& c : std::vector<Case>{{"gelu_bias", 16384, 768, 3072, false},
                                         {"gelu_bias", 1024, 256, 512, true},
                                         {"dgelu", 16384, 768, 3072, true},
                                         {"dgelu", 1024, 256, 512, false}}) {
    INFO(c.kind << " [" << c.rows << ", " << c.K << "] x " << c.N << (c.bT ? " b^T" : ""));
    EpilogueNode e = epilogueNode(c.kind, {c.rows, c.K}, c.bT ? Shape{c.N, c.K} : Shape{c.K, c.N}, c.bT, DType::bf16);
    auto l = lowerGemm(*e.n, ctx);
    REQUIRE(l.ok());
    const KernelSpec& k = l->kernels[0];
    CHECK(k.clusterX == 2);
    CHECK(k.source.find("#define GM_CLUSTER 2") != std::string::npos);
    CHECK(k.grid.x == std::min<int64_t>(132, c.rows / 128 * (c.N / 256)));  // even either way here
    CHECK(k.grid.x % 2 == 0);
    if (c.bT) checkMap(k, 1, true, 1, c.N, c.K, 128);
    else checkMap(k, 1, true, 1, c.K, c.N, 64);
    auto cubin = nvrtc.compile(k.source, k.entry, true);
    INFO((cubin.ok() ? std::string() : cubin.error()));
    REQUIRE(cubin.ok());
    checkNoSpills(nvrtc, k);
  }
  // 3 row tiles: no pairs, so no clusters (and b^T's whole 256-row tile a box).
  EpilogueNode odd = geluBias({384, 512}, {768, 512}, DType::bf16, true);
  auto l = lowerGemm(*odd.n, ctx);
  REQUIRE(l.ok());
  CHECK(l->kernels[0].clusterX == 1);
  CHECK(l->kernels[0].source.find("#define GM_CLUSTER 1") != std::string::npos);
  CHECK(l->kernels[0].grid.x == 9);
  checkMap(l->kernels[0], 1, true, 1, 768, 512, 256);
  // Two tiles a row block, one row-tile pair: one cluster.
  EpilogueNode two = geluBias({256, 512}, {512, 256});
  auto l2 = lowerGemm(*two.n, ctx);
  REQUIRE(l2.ok());
  CHECK(l2->kernels[0].clusterX == 2);
  CHECK(l2->kernels[0].grid.x == 2);
  // Without multicast: no clusters.
  REQUIRE(setOwnGemmKinds("all", "TPC_OWN_GEMM", &ctx).ok());
  auto plain = lowerGemm(*two.n, ctx);
  REQUIRE(plain.ok());
  CHECK(plain->kernels[0].clusterX == 1);
  CHECK(plain->kernels[0].source.find("#define GM_CLUSTER 1") != std::string::npos);
}

TEST_CASE("gemm sm90: the dgelu kernel's arguments, descriptors and its NVRTC compile for sm_90a", "[cuda]") {
  LoweringContext ctx;
  ctx.ownDgeluGemm = true;
  ctx.numSMs = 132;
  EpilogueNode c = dgelu({16, 1024, 768}, {3072, 768}, true);
  auto l = lowerGemm(*c.n, ctx);
  REQUIRE(l.ok());
  REQUIRE(l->kernels.size() == 1);
  const KernelSpec& k = l->kernels[0];
  CHECK(k.entry == "gemm_dgelu_kernel");
  CHECK(k.archSpecific);
  CHECK(k.requiredRegisters == 168);
  CHECK(k.grid.x == 132);
  CHECK(k.block.x == 384);
  // The descriptors of a, b and g, then pre's address (read in the fragments' layout, not by TMA).
  REQUIRE(k.args.size() == 4);
  for (int i = 0; i < 3; ++i) CHECK((k.args[i].kind == ArgKind::TensorMap && k.args[i].index == i));
  CHECK((k.args[3].kind == ArgKind::Operand && k.args[3].index == 2));
  REQUIRE(k.maps.size() == 3);
  checkMap(k, 0, true, 0, 16384, 768, 128);
  checkMap(k, 1, true, 1, 3072, 768, 256);  // b^T [N, K]: K-major boxes of 256 n-rows
  checkMap(k, 2, false, 0, 16384, 3072, 8);
  CHECK(k.source.find("#define GM_EPI 2") != std::string::npos);
  CHECK(k.source.find("#define GM_MODE 2") != std::string::npos);

  CHECK(k.source.find("#define GM_PRE_AHEAD 3") != std::string::npos);  // unless pre1 is asked for

  // Every variant compiles: b^T or b, K under 512 or not (K 512: 8 k-slices, the first pre copies after the
  // mainloop), pre copied 3 or 1 chunks ahead.
  test::TempDir cache;
  NvrtcCompiler nvrtc(90, cache.path.string());
  for (auto [K, bT, ahead] : std::vector<std::tuple<int64_t, bool, int>>{
           {768, true, 3}, {256, true, 3}, {512, false, 3}, {256, false, 3}, {768, true, 1}, {512, false, 1}, {256, true, 1}}) {
    INFO("K " << K << (bT ? " b^T" : "") << ", pre " << ahead << " ahead");
    ctx.ownGemmPreAhead = ahead;
    EpilogueNode g = bT ? dgelu({1024, K}, {512, K}, true) : dgelu({1024, K}, {K, 512}, false);
    auto lg = lowerGemm(*g.n, ctx);
    REQUIRE(lg.ok());
    const KernelSpec& kg = lg->kernels[0];
    CHECK(kg.source.find(K >= 512 ? "#define GM_MODE 2" : "#define GM_MODE 1") != std::string::npos);
    CHECK(kg.source.find(cat("#define GM_PRE_AHEAD ", ahead, "\n")) != std::string::npos);
    auto cubin = nvrtc.compile(kg.source, kg.entry, true);
    INFO((cubin.ok() ? std::string() : cubin.error()));
    REQUIRE(cubin.ok());
    CHECK(!cubin->empty());
    checkNoSpills(nvrtc, kg);
  }
}

// dgelu_bgrad: (a, b, pre) -> (g, db) with db g's column sums: our kernel when its own switch is on (the fold makes
// the node only where it runs it), then a kernel summing the warps' 16-row partials ([M / 16, N] f32 in the
// workspace) in order into db, in db's type.
TEST_CASE("gemm sm90: dgelu_bgrad runs our kernel, then the column sums of its partials", "[cuda]") {
  LoweringContext ctx;
  ctx.numSMs = 132;
  EpilogueNode c = epilogueNode("dgelu_bgrad", {16, 1024, 768}, {3072, 768}, true, DType::bf16);
  CHECK_FALSE(ownGemm(*c.n, ctx));  // off unless asked for
  ctx.ownDgeluGemm = true;
  CHECK_FALSE(ownGemm(*c.n, ctx));  // dgelu's switch is not dgelu_bgrad's
  ctx.ownDgeluBgradGemm = true;
  CHECK(ownGemm(*c.n, ctx));
  ctx.ownDgeluGemm = false;
  CHECK(ownGemm(*c.n, ctx));
  CHECK_FALSE(ownGemm(*dgelu({16, 1024, 768}, {3072, 768}, true).n, ctx));  // and the other way round
  CHECK_FALSE(ownGemm(*epilogueNode("dgelu_bgrad", {16, 1024, 768}, {384, 768}, true, DType::bf16).n, ctx));

  auto l = lowerGemm(*c.n, ctx);
  REQUIRE(l.ok());
  REQUIRE(l->kernels.size() == 2);
  CHECK(l->workspaceBytes == 16384 / 16 * 3072 * 4);
  const KernelSpec& k = l->kernels[0];
  CHECK(k.entry == "gemm_dgelu_bgrad_kernel");
  CHECK(k.source.find("#define GM_EPI 3") != std::string::npos);
  CHECK(k.grid.x == 132);
  // The descriptors of a, b and g, pre's address, then the partials' (the workspace).
  REQUIRE(k.args.size() == 5);
  for (int i = 0; i < 3; ++i) CHECK((k.args[i].kind == ArgKind::TensorMap && k.args[i].index == i));
  CHECK((k.args[3].kind == ArgKind::Operand && k.args[3].index == 2));
  CHECK((k.args[4].kind == ArgKind::Workspace && k.args[4].index == 0));
  const KernelSpec& cols = l->kernels[1];
  CHECK(cols.entry == "tpc_dgelu_bgrad_columns");
  CHECK(cols.grid.x == 3072 / 32);
  CHECK((cols.block.x == 32 && cols.block.y == 32));
  REQUIRE(cols.args.size() == 2);
  CHECK((cols.args[0].kind == ArgKind::Workspace && cols.args[0].index == 0));
  CHECK((cols.args[1].kind == ArgKind::Result && cols.args[1].index == 1));

  // Every variant compiles without spills (K under 512 or not, b or b^T, with multicast), and the column kernel.
  test::TempDir cache;
  NvrtcCompiler nvrtc(90, cache.path.string());
  for (auto [K, bT, mc, ahead] : std::vector<std::tuple<int64_t, bool, bool, int>>{
           {768, true, false, 3}, {256, true, false, 3}, {512, false, false, 3}, {256, false, false, 3},
           {768, true, true, 3}, {768, true, false, 1}}) {
    INFO("K " << K << (bT ? " b^T" : "") << (mc ? " multicast" : "") << ", pre " << ahead << " ahead");
    ctx.ownGemmMulticast = mc;
    ctx.ownGemmPreAhead = ahead;
    EpilogueNode g = epilogueNode("dgelu_bgrad", {1024, K}, bT ? Shape{512, K} : Shape{K, 512}, bT, DType::bf16);
    auto lg = lowerGemm(*g.n, ctx);
    REQUIRE(lg.ok());
    const KernelSpec& kg = lg->kernels[0];
    CHECK(kg.clusterX == (mc ? 2u : 1u));
    auto cubin = nvrtc.compile(kg.source, kg.entry, true);
    INFO((cubin.ok() ? std::string() : cubin.error()));
    REQUIRE(cubin.ok());
    checkNoSpills(nvrtc, kg);
    auto colCubin = nvrtc.compile(lg->kernels[1].source, lg->kernels[1].entry);
    INFO((colCubin.ok() ? std::string() : colCubin.error()));
    CHECK(colCubin.ok());
  }
}

// A bf16 GPT training step as the backend rewrites it with TPC_OWN_GEMM=all (the default epilogue list, and
// dgelu_bgrad where our kernel takes it): every layer's c_fc runs our gelu_bias, its input gradient our
// dgelu_bgrad, c_attn our bias and its input gradient our bgrad_a, and the attention projection and c_proj our
// bias_residual, and each lowers. Hidden
// 256 (4 x 256 = 1024 columns, 3 x 256 = 768 for c_attn), 2 x 128 tokens.
TEST_CASE("gemm sm90: a bf16 GPT step's GELU matmuls, c_attn, the projections and c_fc's bias gradient all run our kernel",
          "[cuda]") {
  GptConfig cfg = test::smallGpt();
  cfg.hidden = 256;
  cfg.positions = 128;
  auto step = test::gptStep(cfg, 2, "mixed-precision(dtype=bf16)," + test::kTrainPasses + ",fuse");
  LoweringContext ctx;
  REQUIRE(setOwnGemmKinds("all", "TPC_OWN_GEMM", &ctx).ok());
  const std::string defaults = ",bias,bias_residual,gelu_bias,dgelu,";
  std::function<bool(const Node&)> canRun = [&](const Node& n) {  // as cuda_backend.cpp's
    if (n.getStr("epilogue") == "dgelu_bgrad") return ownGemm(n, ctx);
    if (n.getStr("epilogue") == "bgrad_a")  // not the residual stream's sums (layer_norm_grad's sum_dx)
      return ownGemm(n, ctx) && !residualStreamGradient(n.operand(0));
    std::string kind = n.getStr("epilogue") + (n.numOperands() == 4 ? "_residual" : "");
    return defaults.find("," + kind + ",") != std::string::npos;
  };
  Status s = rewriteForCuda(*step, canRun);
  INFO((s.ok() ? std::string() : s.error()));
  REQUIRE(s.ok());
  std::map<std::string, int> ours, other;
  for (const Node* n : step->nodes()) {
    if (n->op() != OpKind::MatmulEpilogue) continue;
    (ownGemm(*n, ctx) ? ours : other)[n->getStr("epilogue") + (n->numOperands() == 4 ? "+residual" : "")]++;
    if (!ownGemm(*n, ctx)) continue;
    INFO(n->getStr("epilogue") << " " << n->operand(0)->type().str() << " x " << n->operand(1)->type().str());
    auto l = lowerGemm(*n, ctx);
    INFO((l.ok() ? std::string() : l.error()));
    CHECK(l.ok());
  }
  // bias+residual: the attention projection and c_proj of each layer; bgrad_a: c_attn's input gradient with its
  // bias sum (over attention_qkv_grad's dQKV).
  CHECK(ours == std::map<std::string, int>{
                    {"gelu_bias", 2}, {"bias", 2}, {"bias+residual", 4}, {"dgelu_bgrad", 2}, {"bgrad_a", 2}});
  for (const Node* n : step->nodes())
    if (n->op() == OpKind::MatmulEpilogue && n->getStr("epilogue") == "bgrad_a") {
      const Node* d = n->operand(0)->def();
      while (d && d->op() == OpKind::Reshape) d = d->operand(0)->def();
      CHECK((d && d->op() == OpKind::AttentionQkvGrad));
    }
  CHECK(other.count("dgelu") == 0);
  CHECK(other.count("dgelu_bgrad") == 0);
  // Without our kernel, the default list keeps dgelu and the bias sum apart (cuBLASLt's DGELU_BGRAD is slower).
  auto plain = test::gptStep(cfg, 2, "mixed-precision(dtype=bf16)," + test::kTrainPasses + ",fuse");
  REQUIRE(setOwnGemmKinds("0", "TPC_OWN_GEMM", &ctx).ok());
  REQUIRE(rewriteForCuda(*plain, canRun).ok());
  std::map<std::string, int> kinds;
  for (const Node* n : plain->nodes())
    if (n->op() == OpKind::MatmulEpilogue) kinds[n->getStr("epilogue")]++;
  CHECK(kinds["dgelu"] == 2);
  CHECK(kinds.count("dgelu_bgrad") == 0);
}

}  // namespace tpc
#endif
