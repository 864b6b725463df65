// Our sm_90 GEMM kernel for matmul_epilogue gelu_bias (runtime/cuda/kernels/gemm_sm90.cpp) without a GPU:
// which nodes it takes (else cuBLASLt), its launch geometry and TMA descriptors, and that its source compiles
// with NVRTC for sm_90a. Its numbers against the unfused ops are the GPU test's (test_matmul_epilogues_gpu.cpp).
#ifdef TPC_HAVE_CUDA
#include <catch2/catch.hpp>

#include "runtime/cuda/kernels/family_lowerings.h"
#include "runtime/cuda/nvrtc_compiler.h"
#include "test_support.h"

namespace tpc {
namespace {

using namespace cuda;

struct GeluBias {
  std::unique_ptr<Graph> g;
  Node* n = nullptr;
};

// %y, %pre = matmul_epilogue(a[rows..., K], b[K, N], bias[N]) {epilogue=gelu_bias}
GeluBias geluBias(Shape a, Shape b, DType t = DType::bf16, bool transposeB = false) {
  GeluBias r;
  r.g = std::make_unique<Graph>("gelu_bias");
  int64_t N = transposeB ? b[0] : b[1];
  Value* x = r.g->addInput("a", TensorType(t, a));
  Value* w = r.g->addInput("b", TensorType(t, b));
  Value* bias = r.g->addInput("bias", TensorType(t, {N}));
  AttrDict at;
  at.set("epilogue", std::string("gelu_bias"));
  if (transposeB) at.set("transpose_b", true);
  auto n = r.g->create(OpKind::MatmulEpilogue, {x, w, bias}, at);
  REQUIRE(n.ok());
  r.n = *n;
  r.g->addOutput(r.n->result(0), "y");
  r.g->addOutput(r.n->result(1), "pre");
  return r;
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
  GeluBias ok = geluBias({1024, 768}, {768, 3072});
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
  GeluBias c = geluBias({16, 1024, 768}, {768, 3072});
  auto l = lowerGemm(*c.n, ctx);
  REQUIRE(l.ok());
  REQUIRE(l->kernels.size() == 1);
  const KernelSpec& k = l->kernels[0];
  CHECK(k.archSpecific);
  CHECK(k.grid.x == 132);  // persistent: one block a SM over 16384/128 x 3072/256 = 1536 tiles
  CHECK(k.block.x == 384);
  CHECK(k.sharedBytes > 200 * 1024);
  CHECK(static_cast<int64_t>(k.sharedBytes) <= ctx.maxSharedBytes);
  // a, b, out, aux as TMA descriptors over their row-major 2-D views; the bias by address.
  REQUIRE(k.maps.size() == 4);
  CHECK((k.maps[0].operand && k.maps[0].index == 0 && k.maps[0].rows == 16384 && k.maps[0].cols == 768));
  CHECK((k.maps[1].operand && k.maps[1].index == 1 && k.maps[1].rows == 768 && k.maps[1].cols == 3072));
  CHECK((!k.maps[2].operand && k.maps[2].index == 0 && k.maps[2].rows == 16384 && k.maps[2].cols == 3072));
  CHECK((!k.maps[3].operand && k.maps[3].index == 1 && k.maps[3].rows == 16384 && k.maps[3].cols == 3072));
  for (const TensorMapSpec& m : k.maps) CHECK(m.boxCols * 2 == 128);  // one 128-byte swizzle row a box row
  bool biasArg = false;
  for (const KernelArg& a : k.args) biasArg |= a.kind == ArgKind::Operand && a.index == 2;
  CHECK(biasArg);
  // A node it does not take is an error naming why, not a wrong kernel.
  GeluBias off = geluBias({1024, 768}, {768, 384});
  auto bad = lowerGemm(*off.n, ctx);
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.error().find("256") != std::string::npos);

  test::TempDir cache;
  NvrtcCompiler nvrtc(90, cache.path.string());
  auto cubin = nvrtc.compile(k.source, k.entry, true);
  INFO((cubin.ok() ? std::string() : cubin.error()));
  REQUIRE(cubin.ok());
  CHECK(!cubin->empty());
  // gpt2-medium's shape compiles too (another source: the sizes are constants of the kernel).
  GeluBias m = geluBias({16, 1024, 1024}, {1024, 4096});
  auto lm = lowerGemm(*m.n, ctx);
  REQUIRE(lm.ok());
  auto cm = nvrtc.compile(lm->kernels[0].source, lm->kernels[0].entry, true);
  INFO((cm.ok() ? std::string() : cm.error()));
  CHECK(cm.ok());
}

}  // namespace tpc
#endif
