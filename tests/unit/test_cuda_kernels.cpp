// The CUDA kernel families (runtime/cuda/kernels) without a GPU: every lowering of every case in
// cuda_kernel_cases.h compiles with NVRTC for sm_90 and has a sane launch geometry; lowerings refuse what
// they cannot run. A hidden test runs the kernels under the CPU emulation of cuda_emulator.h against the
// CPU backend (the same comparison as the GPU test in tests/gpu/test_cuda_kernels_gpu.cpp).
#ifdef TPC_HAVE_CUDA

#include <cctype>
#include <cstring>
#include <map>

#include "cuda_emulator.h"
#include "cuda_kernel_cases.h"
#include "runtime/cuda/nvrtc_compiler.h"
#include "test_support.h"

using namespace tpc;
using namespace tpc::test;
using namespace tpc::test::kernels;

namespace {

// Parameters in the entry's signature (commas at parenthesis depth 1 after "entry(").
int countParams(const KernelSpec& k) {
  size_t at = k.source.find(k.entry + "(");
  if (at == std::string::npos) return -1;
  int depth = 0, n = 0;
  bool any = false;
  for (size_t i = at + k.entry.size(); i < k.source.size(); ++i) {
    char ch = k.source[i];
    if (ch == '(') ++depth;
    else if (ch == ')' && --depth == 0) break;
    else if (ch == ',' && depth == 1) ++n;
    else if (depth == 1 && !std::isspace(static_cast<unsigned char>(ch))) any = true;
  }
  return any ? n + 1 : 0;
}

// Whether `name` contains one of the '|'-separated parts of `filter`.
bool matchesAny(const std::string& name, const std::string& filter) {
  size_t b = 0;
  while (b <= filter.size()) {
    size_t e = filter.find('|', b);
    if (e == std::string::npos) e = filter.size();
    if (e > b && name.find(filter.substr(b, e - b)) != std::string::npos) return true;
    b = e + 1;
  }
  return false;
}

}  // namespace

TEST_CASE("cuda kernels: every family lowering compiles with NVRTC for sm_90 with a sane launch", "[cuda]") {
  TempDir cache;
  cuda::NvrtcCompiler nvrtc(90, cache.path.string());
  std::map<std::string, bool> compiled;  // by source: several cases share a kernel
  for (const Case& c : allCases()) {
    INFO(c.name);
    OneOp o = oneOp(c.op, c.types, c.attrs);
    auto low = lowerCase(c, o);
    REQUIRE(low.ok());
    REQUIRE(!low->kernels.empty());
    CHECK(low->workspaceBytes >= 0);
    for (const KernelSpec& k : low->kernels) {
      INFO(k.entry);
      CHECK(k.grid.x >= 1);
      CHECK(k.grid.y >= 1);
      CHECK(k.grid.z >= 1);
      CHECK(k.grid.y <= 65535);
      CHECK(k.grid.z <= 65535);
      uint64_t threads = uint64_t(k.block.x) * k.block.y * k.block.z;
      CHECK(threads >= 32);
      CHECK(threads <= 1024);
      CHECK(threads % 32 == 0);  // block reductions shuffle whole warps
      CHECK(k.sharedBytes <= 227u * 1024u);
      CHECK(countParams(k) == static_cast<int>(k.args.size()));
      for (const auto& a : k.args) {
        if (a.kind == ArgKind::Operand) CHECK(a.index < o.node->numOperands());
        if (a.kind == ArgKind::Result) CHECK(a.index < o.node->numResults());
        if (a.kind == ArgKind::Workspace) CHECK(a.index < std::max<int64_t>(low->workspaceBytes, 1));
      }
      if (compiled.count(k.source)) continue;
      auto cubin = nvrtc.compile(k.source, k.entry);
      INFO((cubin.ok() ? std::string() : cubin.error()));
      CHECK(cubin.ok());
      compiled[k.source] = cubin.ok();
    }
    if (!hasOldVariant(c)) continue;
    auto old = lowerCase(c, o, oldMembwKernels());  // TPC_MEMBW_OFF=lngrad2,embgrad2
    REQUIRE(old.ok());
    for (const KernelSpec& k : old->kernels) {
      INFO("old " << k.entry);
      CHECK(countParams(k) == static_cast<int>(k.args.size()));
      if (compiled.count(k.source)) continue;
      auto cubin = nvrtc.compile(k.source, k.entry);
      INFO((cubin.ok() ? std::string() : cubin.error()));
      CHECK(cubin.ok());
      compiled[k.source] = cubin.ok();
    }
  }
  CHECK(compiled.size() > 60);
}

// The faster layer_norm_grad and embedding_grad (LoweringContext::layerNormGradBlocks, embeddingGradSegments):
// their kernels and workspaces at gpt2's sizes.
TEST_CASE("cuda kernels: layer_norm_grad and embedding_grad at gpt2 sizes: the new kernels' geometry", "[cuda]") {
  TensorType x(DType::bf16, {16, 1024, 768}), g(DType::f32, {768});
  OneOp ln = oneOp(OpKind::LayerNormGrad, {x, x, g, x}, attrs({{"eps", 1e-5}}));
  auto l = (*cuda::findFamilyLowering(OpKind::LayerNormGrad))(*ln.node, sm90());
  REQUIRE(l.ok());
  REQUIRE(l->kernels.size() == 2);
  CHECK(l->kernels[0].entry == "tpc_layer_norm_grad_rows");
  // One wave of three 4-warp blocks a SM (dgamma/dbeta in registers): 16384 rows over 132 x 12 warps, 11 a warp.
  CHECK(l->kernels[0].grid.x == 373);
  CHECK(l->kernels[0].source.find("#define REG_ACC 1") != std::string::npos);
  CHECK(l->kernels[0].args.size() == 7);
  CHECK(l->workspaceBytes == 2 * 373 * 768 * 4);  // one partial row of dgamma and dbeta per block
  // sum_dx: a third partial row per block, dx's sums in shared memory, a third column sum in the second kernel.
  OneOp lns = oneOp(OpKind::LayerNormGrad, {x, x, g, x}, attrs({{"eps", 1e-5}, {"sum_dx", true}}));
  auto ls = (*cuda::findFamilyLowering(OpKind::LayerNormGrad))(*lns.node, sm90());
  REQUIRE(ls.ok());
  REQUIRE(ls->kernels.size() == 2);
  CHECK(ls->kernels[0].source.find("#define REG_ACC 1") != std::string::npos);
  CHECK(ls->kernels[0].source.find("#define SUM_REG 0") != std::string::npos);
  CHECK(ls->kernels[0].args.size() == 8);
  CHECK(ls->kernels[1].grid.y == 3);
  CHECK(ls->workspaceBytes == 3 * 373 * 768 * 4);
  auto lso = (*cuda::findFamilyLowering(OpKind::LayerNormGrad))(*lns.node, oldMembwKernels());
  REQUIRE(!lso.ok());  // the old kernel does not sum dx: the fold asks layerNormGradSumsDx first
  CHECK(lso.error().find("sum_dx") != std::string::npos);
  CHECK(cuda::layerNormGradSumsDx(*lns.node, sm90()));
  CHECK(!cuda::layerNormGradSumsDx(*lns.node, oldMembwKernels()));
  auto lo = (*cuda::findFamilyLowering(OpKind::LayerNormGrad))(*ln.node, oldMembwKernels());
  REQUIRE(lo.ok());
  CHECK(lo->kernels[0].entry == "tpc_layer_norm_grad_warp");

  TensorType dy(DType::bf16, {16, 1024, 768}), ids(DType::i32, {16, 1024});
  OneOp eg = oneOp(OpKind::EmbeddingGrad, {dy, ids}, attrs({{"vocab", int64_t(50304)}}));
  auto e = (*cuda::findFamilyLowering(OpKind::EmbeddingGrad))(*eg.node, sm90());
  REQUIRE(e.ok());
  std::string names;
  for (const KernelSpec& k : e->kernels) names += k.entry + " ";
  CHECK(names ==
        "tpc_embedding_grad_count tpc_embedding_grad_scan tpc_embedding_grad_fill tpc_embedding_grad_rank "
        "tpc_embedding_grad_tiles tpc_embedding_grad_rows ");
  CHECK(e->kernels.back().grid.x == 50304 / 4);  // a warp per table row
  CHECK(e->zeroWorkspace);
  auto eo = (*cuda::findFamilyLowering(OpKind::EmbeddingGrad))(*eg.node, oldMembwKernels());
  REQUIRE(eo.ok());
  CHECK(eo->kernels.size() == 4);
}

// layer_norm_grad's rows through a cp.async ring (LoweringContext::layerNormGradStages) at gpt2's and
// gpt2-medium's widths: the ring's shared memory (x, dy and the residual: 3 x 1.5 KiB a row at 768) sets the
// blocks a SM, and no configuration spills (ptxas; MIN_BLOCKS lets it take more registers where shared
// memory allows fewer blocks). Rows of element loads (771) keep the register prefetch.
TEST_CASE("cuda kernels: layer_norm_grad's ring of rows: geometry, and no spills at gpt2 widths", "[cuda]") {
  TempDir cache;
  cuda::NvrtcCompiler nvrtc(90, cache.path.string());
  for (int64_t D : {int64_t(768), int64_t(1024)})
    for (int stages : {2, 3})
      for (bool sumDx : {false, true}) {
        INFO("D " << D << ", " << stages << " stages" << (sumDx ? ", sum_dx" : ""));
        TensorType x(DType::bf16, {16, 1024, D}), g(DType::f32, {D});
        AttrDict a = attrs({{"eps", 1e-5}});
        if (sumDx) a.set("sum_dx", true);
        OneOp ln = oneOp(OpKind::LayerNormGrad, {x, x, g, x}, a);
        LoweringContext ctx = sm90();
        ctx.layerNormGradStages = stages;
        ctx.layerNormGradWide = false;  // the stages asked for at 1024 too
        auto l = (*cuda::findFamilyLowering(OpKind::LayerNormGrad))(*ln.node, ctx);
        REQUIRE(l.ok());
        const KernelSpec& k = l->kernels[0];
        CHECK(k.source.find(cat("#define STAGES ", stages, "\n")) != std::string::npos);
        const int64_t ring = 4 * stages * 3 * D * 2;  // 4 warps, three 16-bit rows a stage
        // The warps' sums (2 or 3 sets; combined through shared memory even where a warp keeps them in registers:
        // D 768), and gamma unless the sums of 1024 columns with sum_dx fill shared memory.
        const bool regAcc = D <= 768;
        const int64_t sums = 4 * (sumDx ? 3 : 2) * D * 4 + (regAcc || !sumDx ? D * 4 : 0);
        CHECK(int64_t(k.sharedBytes) == ring + sums);
        const int64_t blocksPerSM = std::min<int64_t>(regAcc || sumDx ? 3 : 4, (228 * 1024) / (ring + sums + 1024));
        const int64_t warps = 132 * blocksPerSM * 4, rpw = (16384 + warps - 1) / warps;
        CHECK(int64_t(k.grid.x) == (16384 + 4 * rpw - 1) / (4 * rpw));
        auto report = nvrtc.ptxasReport(k.source, k.entry);
        INFO((report.ok() ? *report : report.error()));
        REQUIRE(report.ok());
        CHECK(report->find(" 0 bytes spill stores, 0 bytes spill loads") != std::string::npos);
      }
  // The defaults (LoweringContext::layerNormGradWide): 1024-wide 16-bit rows through a ring of 2 with every sum in
  // registers, two blocks a SM (84-100 KiB of shared memory each), no spills; 768 keeps the register prefetch; f32 rows of 1024 (64 registers' worth
  // a lane) and the switch off keep the settings.
  for (bool sumDx : {false, true}) {
    INFO((sumDx ? "sum_dx" : "no sum_dx"));
    AttrDict a = attrs({{"eps", 1e-5}});
    if (sumDx) a.set("sum_dx", true);
    auto lower = [&](DType dt, int64_t D, bool wideOn) {
      TensorType x(dt, {16, 1024, D}), g(DType::f32, {D});
      OneOp ln = oneOp(OpKind::LayerNormGrad, {x, x, g, x}, a);
      LoweringContext ctx = sm90();
      ctx.layerNormGradWide = wideOn;
      auto l = (*cuda::findFamilyLowering(OpKind::LayerNormGrad))(*ln.node, ctx);
      REQUIRE(l.ok());
      return l->kernels[0];
    };
    const KernelSpec k = lower(DType::bf16, 1024, true);
    CHECK(k.source.find("#define STAGES 2\n") != std::string::npos);
    CHECK(k.source.find("#define REG_ACC 1\n") != std::string::npos);
    CHECK(k.source.find(cat("#define SUM_REG ", sumDx ? 1 : 0, "\n")) != std::string::npos);
    CHECK(k.source.find("#define MIN_BLOCKS 2\n") != std::string::npos);
    const int64_t ring = 4 * 2 * 3 * 1024 * 2, sums = 4 * (sumDx ? 3 : 2) * 1024 * 4 + 1024 * 4;  // and gamma
    CHECK(int64_t(k.sharedBytes) == ring + sums);
    auto report = nvrtc.ptxasReport(k.source, k.entry);
    INFO((report.ok() ? *report : report.error()));
    REQUIRE(report.ok());
    CHECK(report->find(" 0 bytes spill stores, 0 bytes spill loads") != std::string::npos);
    CHECK(lower(DType::bf16, 768, true).source.find("#define STAGES 0\n") != std::string::npos);
    CHECK(lower(DType::f32, 1024, true).source.find("#define REG_ACC 0\n") != std::string::npos);
    const KernelSpec off = lower(DType::bf16, 1024, false);
    CHECK(off.source.find("#define STAGES 0\n") != std::string::npos);
    CHECK(off.source.find("#define REG_ACC 0\n") != std::string::npos);
  }
  // Stages that would not fit a block's shared memory are dropped to those that do: 2048 columns with the residual
  // and sum_dx, 8 asked for (96 KiB of the warps' sums, 48 KiB a stage for 4 warps) -> 2.
  {
    TensorType x(DType::bf16, {4096, 2048}), g(DType::f32, {2048});
    OneOp ln = oneOp(OpKind::LayerNormGrad, {x, x, g, x}, attrs({{"eps", 1e-5}, {"sum_dx", true}}));
    LoweringContext ctx = sm90();
    ctx.layerNormGradStages = 8;
    auto l = (*cuda::findFamilyLowering(OpKind::LayerNormGrad))(*ln.node, ctx);
    REQUIRE(l.ok());
    CHECK(l->kernels[0].sharedBytes <= 227u * 1024u);
    CHECK(l->kernels[0].source.find("#define STAGES 2\n") != std::string::npos);
    CHECK(l->kernels[1].source.find("tpc_ring_fill") == std::string::npos);  // the column kernel has no ring
  }
  TensorType odd(DType::f16, {300, 771}), g(DType::f32, {771});
  OneOp ln = oneOp(OpKind::LayerNormGrad, {odd, odd, g, odd}, attrs({{"eps", 1e-5}}));
  LoweringContext ctx = sm90();
  ctx.layerNormGradStages = 3;
  auto l = (*cuda::findFamilyLowering(OpKind::LayerNormGrad))(*ln.node, ctx);
  REQUIRE(l.ok());
  CHECK(l->kernels[0].source.find("#define STAGES 0\n") != std::string::npos);
}

TEST_CASE("cuda kernels: lowerings refuse what they cannot run", "[cuda]") {
  OneOp big = oneOp(OpKind::Attention, {f32({1, 1, 8, 160}), f32({1, 1, 8, 160}), f32({1, 1, 8, 160})});
  auto r = (*cuda::findFamilyLowering(OpKind::Attention))(*big.node, sm90());
  REQUIRE_FALSE(r.ok());
  CHECK(r.error().find("head_dim <= 128") != std::string::npos);
  OneOp f64 = oneOp(OpKind::Softmax, {TensorType(DType::f64, {3, 4})});
  auto s = (*cuda::findFamilyLowering(OpKind::Softmax))(*f64.node, sm90());
  REQUIRE_FALSE(s.ok());
  CHECK(s.error().find("f64") != std::string::npos);
  // layer_norm adds a residual in its warp-row kernel only: rows of at most 2048 (layerNormTakesResidual).
  OneOp wide = oneOp(OpKind::LayerNorm, {f32({4, 4096}), f32({4096}), f32({4096}), f32({4, 4096})});
  auto w = (*cuda::findFamilyLowering(OpKind::LayerNorm))(*wide.node, sm90());
  REQUIRE_FALSE(w.ok());
  CHECK(w.error().find("at most 2048") != std::string::npos);
  CHECK_FALSE(cuda::layerNormTakesResidual(*wide.node));
  OneOp narrow = oneOp(OpKind::LayerNorm, {f32({4, 2048}), f32({2048}), f32({2048}), f32({4, 2048})});
  CHECK(cuda::layerNormTakesResidual(*narrow.node));
  CHECK(cuda::findFamilyLowering(OpKind::Matmul) == nullptr);
  CHECK(cuda::findFamilyLowering(OpKind::Add) == nullptr);
  for (OpKind op : {OpKind::Attention, OpKind::AttentionGrad, OpKind::LayerNorm, OpKind::CrossEntropy,
                    OpKind::EmbeddingGrad, OpKind::ReduceMax, OpKind::GlobalNorm, OpKind::AdamWUpdate})
    CHECK(cuda::findFamilyLowering(op) != nullptr);
}

TEST_CASE("cuda kernels: bf16/f16 attention with head_dim % 16 == 0 takes the tensor-core kernels", "[cuda]") {
  auto entries = [](DType dt, Shape s, OpKind op) {
    TensorType t(dt, s), lse(DType::f32, {s[0], s[1], s[2]});
    std::vector<TensorType> types = op == OpKind::Attention ? std::vector<TensorType>{t, t, t}
                                                            : std::vector<TensorType>{t, t, t, t, t, lse};
    OneOp o = oneOp(op, types);
    auto low = (*cuda::findFamilyLowering(op))(*o.node, sm90());
    REQUIRE(low.ok());
    std::string names;
    for (const KernelSpec& k : low->kernels) names += k.entry + " ";
    return names;
  };
  for (OpKind op : {OpKind::Attention, OpKind::AttentionGrad}) {
    INFO(opName(op));
    CHECK(entries(DType::bf16, {2, 12, 1024, 64}, op).find("_tc ") != std::string::npos);
    CHECK(entries(DType::f16, {1, 2, 77, 128}, op).find("_tc ") != std::string::npos);
    CHECK(entries(DType::f32, {1, 2, 77, 64}, op).find("_tc") == std::string::npos);
    CHECK(entries(DType::bf16, {1, 2, 77, 40}, op).find("_tc") == std::string::npos);
  }
  CHECK(entries(DType::bf16, {2, 12, 1024, 64}, OpKind::AttentionGrad) ==
        "tpc_attention_bwd_di tpc_attention_bwd_dkdv_tc tpc_attention_bwd_dq_tc ");
}

// TcAttnOptions::wideWarps: blocks of 128 rows (two m16 groups a warp) in the forward and dq, in dk/dv only at
// head_dim <= 64; the walked tile sizes picked per kernel; TPC_TC_ATTENTION=narrow; a bad walkRows is refused.
TEST_CASE("cuda kernels: tensor-core attention tiling per kernel, head_dim and options", "[cuda]") {
  auto lower = [](int64_t D, const cuda::TcAttnOptions& opt) {
    TensorType t(DType::bf16, {2, 12, 1024, D}), lse(DType::f32, {2, 12, 1024});
    OneOp f = oneOp(OpKind::Attention, {t, t, t}, attrs({{"causal", true}}));
    OneOp b = oneOp(OpKind::AttentionGrad, {t, t, t, t, t, lse}, attrs({{"causal", true}}));
    auto fl = cuda::lowerAttentionTensorCore(*f.node, sm90(), opt);
    auto bl = cuda::lowerAttentionGradTensorCore(*b.node, sm90(), opt);
    REQUIRE(fl.ok());
    REQUIRE(bl.ok());
    std::vector<KernelSpec> ks = fl->kernels;  // fwd, di, dkdv, dq
    ks.insert(ks.end(), bl->kernels.begin(), bl->kernels.end());
    return ks;
  };
  auto has = [](const KernelSpec& k, const std::string& s) { return k.source.find(s) != std::string::npos; };
  const uint32_t bh = 2 * 12;
  cuda::TcAttnOptions wide;
  wide.wideBackward = true;
  std::vector<KernelSpec> w64 = lower(64, wide), w128 = lower(128, wide), n64 = lower(64, cuda::TcAttnOptions::narrow());
  std::vector<KernelSpec> d64 = lower(64, {});  // the default: wide forward, 16-row warps in the backward
  CHECK(d64[0].source == w64[0].source);
  CHECK((has(d64[2], "#define RG 1\n") && has(d64[2], "#define BN 64\n")));
  CHECK((has(d64[3], "#define RG 1\n") && has(d64[3], "#define BN 64\n")));
  CHECK(w64[0].grid.x == bh * 8);  // 128 queries a block
  CHECK((has(w64[0], "#define RG 2\n") && has(w64[0], "#define BN 64\n") && has(w64[0], "#define A_FRAGS 1\n")));
  CHECK(w64[2].grid.x == bh * 8);
  CHECK((has(w64[2], "#define RG 2\n") && has(w64[2], "#define BN 32\n")));
  CHECK(w64[3].grid.x == bh * 8);
  CHECK((has(w64[3], "#define RG 2\n") && has(w64[3], "#define BN 32\n")));
  CHECK((has(w128[0], "#define RG 2\n") && has(w128[0], "#define BN 32\n") && has(w128[0], "#define A_FRAGS 0\n")));
  CHECK(w128[2].grid.x == bh * 16);  // dk/dv keeps 16 keys a warp at head_dim 128
  CHECK((has(w128[2], "#define RG 1\n") && has(w128[2], "#define BN 64\n")));
  CHECK((has(w128[3], "#define RG 2\n") && has(w128[3], "#define BN 16\n")));
  for (size_t i : {0, 2, 3}) {
    CHECK(n64[i].grid.x == bh * 16);
    CHECK((has(n64[i], "#define RG 1\n") && has(n64[i], "#define BN 64\n")));
  }
  CHECK(w64[0].sharedBytes == (128 + 2 * 2 * 64) * 72 * 2);  // q block + two stages of k and v tiles
  // TPC_TC_ATTENTION=narrow: the runtime's lowering takes TcAttnOptions::narrow().
  auto runtimeFwd = [](int64_t D) {
    TensorType t(DType::bf16, {2, 12, 1024, D});
    OneOp f = oneOp(OpKind::Attention, {t, t, t}, attrs({{"causal", true}}));
    return (*cuda::findFamilyLowering(OpKind::Attention))(*f.node, sm90());
  };
  ::setenv("TPC_TC_ATTENTION", "narrow", 1);
  auto narrowed = runtimeFwd(64);
  ::setenv("TPC_TC_ATTENTION", "split", 1);
  auto split = runtimeFwd(64);
  ::setenv("TPC_TC_ATTENTION", "slim", 1);
  auto refused = runtimeFwd(64);
  ::unsetenv("TPC_TC_ATTENTION");
  REQUIRE(narrowed.ok());
  CHECK(narrowed->kernels[0].source == n64[0].source);
  // =split: the shipped kernels with P as a hi + lo pair (splitP), a different source than the default's.
  cuda::TcAttnOptions splitP;
  splitP.splitP = true;
  REQUIRE(split.ok());
  CHECK(split->kernels[0].source == lower(64, splitP)[0].source);
  CHECK(split->kernels[0].source != d64[0].source);
  REQUIRE(!refused.ok());
  CHECK(refused.error().find("TPC_TC_ATTENTION must be 'wide', 'narrow' or 'split', got 'slim'") != std::string::npos);
  REQUIRE(runtimeFwd(64).ok());
  CHECK(runtimeFwd(64)->kernels[0].source == w64[0].source);
  cuda::TcAttnOptions bad;
  bad.walkRows = 48;
  TensorType t(DType::bf16, {1, 2, 77, 64});
  OneOp f = oneOp(OpKind::Attention, {t, t, t});
  auto r = cuda::lowerAttentionTensorCore(*f.node, sm90(), bad);
  REQUIRE(!r.ok());
  CHECK(r.error().find("walkRows must be 0, 16, 32 or 64, got 48") != std::string::npos);
}

// cross_entropy(_with)_grad take loss_resident.cpp's kernel for 16-bit logits in 16-byte pieces whose two rows fit in
// shared memory, unless LoweringContext::xentOnePass is off (TPC_MEMBW_OFF=xent1); gpt2: a block of 1024 per SM.
TEST_CASE("cuda kernels: the row-resident cross-entropy grad kernel where it applies", "[cuda]") {
  auto lower = [](OpKind op, DType dt, int64_t V, const LoweringContext& ctx) {
    TensorType lt(dt, {16384, V}), rows(DType::f32, {16384}), tg(DType::i32, {16384});
    OneOp o = oneOp(op, {rows, lt, tg}, attrs({{"ignore_index", int64_t(-1)}, {"num_classes", int64_t(V - 7)}}));
    auto low = (*cuda::findFamilyLowering(op))(*o.node, ctx);
    REQUIRE(low.ok());
    REQUIRE(low->kernels.size() == 1);
    return low->kernels[0];
  };
  LoweringContext off = sm90();
  off.xentOnePass = false;
  KernelSpec k = lower(OpKind::CrossEntropyWithGrad, DType::bf16, 50304, sm90());
  CHECK(k.entry == "tpc_cross_entropy_with_grad_resident");
  CHECK(k.block.x == 1024);
  CHECK(k.grid.x == 132);
  CHECK(k.sharedBytes == 2 * 50304 * 2);
  CHECK(k.source.find("#define K 7\n#define KV 6\n#define KC 6\n") != std::string::npos);
  CHECK(lower(OpKind::CrossEntropyGrad, DType::f16, 50304, sm90()).entry == "tpc_cross_entropy_grad_resident");
  CHECK(lower(OpKind::CrossEntropyWithGrad, DType::bf16, 50304, off).entry == "tpc_cross_entropy_with_grad");
  CHECK(lower(OpKind::CrossEntropyWithGrad, DType::f32, 50304, sm90()).entry == "tpc_cross_entropy_with_grad");
  CHECK(lower(OpKind::CrossEntropyWithGrad, DType::bf16, 50303, sm90()).entry == "tpc_cross_entropy_with_grad");
  CHECK(lower(OpKind::CrossEntropyWithGrad, DType::bf16, 60000, sm90()).entry == "tpc_cross_entropy_with_grad");
  // Smaller rows: several blocks an SM (by threads and shared memory), NT the pieces rounded to a warp.
  KernelSpec s = lower(OpKind::CrossEntropyGrad, DType::bf16, 2000, sm90());
  CHECK(s.block.x == 256);
  CHECK(s.grid.x == 132 * 8);
  CHECK(lower(OpKind::CrossEntropyGrad, DType::bf16, 32768, sm90()).grid.x == 132 * 1);
  CHECK(lower(OpKind::CrossEntropyGrad, DType::bf16, 16384, sm90()).grid.x == 132 * 2);
}

TEST_CASE("cuda kernels: attention_qkv lowers to attention's kernels with the packed layout's strides", "[cuda]") {
  // gpt2: qkv bf16[2, 1024, 3, 12, 64], out [2, 1024, 12, 64].
  TensorType qkv(DType::bf16, {2, 1024, 3, 12, 64}), o(DType::bf16, {2, 1024, 12, 64}), lse(DType::f32, {2, 12, 1024});
  AttrDict perm;
  perm.set("perm", std::vector<int64_t>{2, 0, 3, 1, 4});
  OneOp fwd = oneOp(OpKind::AttentionQkv, {qkv}, perm);
  OneOp bwd = oneOp(OpKind::AttentionQkvGrad, {o, qkv, o, lse}, perm);
  auto f = (*cuda::findFamilyLowering(OpKind::AttentionQkv))(*fwd.node, sm90());
  auto b = (*cuda::findFamilyLowering(OpKind::AttentionQkvGrad))(*bwd.node, sm90());
  REQUIRE(f.ok());
  REQUIRE(b.ok());
  REQUIRE(f->kernels.size() == 1);
  REQUIRE(b->kernels.size() == 3);
  CHECK(f->kernels[0].entry == "tpc_attention_fwd_tc");
  CHECK(b->kernels[1].entry == "tpc_attention_bwd_dkdv_tc");
  CHECK(b->kernels[2].entry == "tpc_attention_bwd_dq_tc");
  // q, k, v: element (b, h, t) at which * 768 + b * 2359296 + h * 64 + t * 2304; out [B, T, H, Dh].
  const std::string& src = f->kernels[0].source;
  CHECK(src.find("#define K_BASE(bh) (768ll + ((bh) / NH) * 2359296ll + ((bh) % NH) * 64ll)") != std::string::npos);
  CHECK(src.find("#define V_BASE(bh) (1536ll + ") != std::string::npos);
  CHECK(src.find("#define Q_ST 2304ll") != std::string::npos);
  CHECK(src.find("#define O_BASE(bh) (0ll + ((bh) / NH) * 786432ll + ((bh) % NH) * 64ll)") != std::string::npos);
  CHECK(src.find("#define O_ST 768ll") != std::string::npos);
  // Every tensor of the packed ops is one operand or result: q, k, v the qkv operand; dq, dk, dv the result.
  for (const cuda::KernelArg& a : f->kernels[0].args)
    if (a.kind == ArgKind::Operand) CHECK(a.index == 0);
  for (const cuda::KernelArg& a : b->kernels[1].args)
    if (a.kind == ArgKind::Result) CHECK(a.index == 0);
  // attention's own strides: contiguous [B, H, T, Dh].
  TensorType t(DType::bf16, {2, 12, 1024, 64});
  OneOp plain = oneOp(OpKind::Attention, {t, t, t});
  auto p = (*cuda::findFamilyLowering(OpKind::Attention))(*plain.node, sm90());
  REQUIRE(p.ok());
  CHECK(p->kernels[0].source.find("#define K_BASE(bh) (0ll + ((bh) / NH) * 786432ll + ((bh) % NH) * 65536ll)") !=
        std::string::npos);
  CHECK(p->kernels[0].source.find("#define K_ST 64ll") != std::string::npos);
}

TEST_CASE("cuda kernels: every tensor-core attention variant compiles with NVRTC for sm_90", "[cuda]") {
  TempDir cache;
  cuda::NvrtcCompiler nvrtc(90, cache.path.string());
  std::map<std::string, bool> compiled;
  int cases = 0;
  for (const TcVariant& v : tcAttentionVariants())
    for (const Case& c : allCases()) {
      // The T 1024 cases differ from the others only in #define'd constants: left out to save compile time.
      if (!isTcAttentionCase(c) || c.name.find("T1024") != std::string::npos) continue;
      INFO(v.name << ": " << c.name);
      OneOp o = oneOp(c.op, c.types, c.attrs);
      auto low = lowerTcVariant(o, v.opt);
      REQUIRE(low.ok());
      ++cases;
      for (const KernelSpec& k : low->kernels) {
        INFO(k.entry);
        CHECK(k.sharedBytes <= sm90().maxSharedBytes);
        if (compiled.count(k.source)) continue;
        auto cubin = nvrtc.compile(k.source, k.entry);
        if (!cubin.ok()) FAIL(cubin.error());
        compiled[k.source] = true;
      }
    }
  CHECK(cases >= 3 * 14);
}

namespace {

// Runs `low` (the lowering of case c as `o`) under the CPU emulator and compares it with the CPU backend;
// returns how many results were compared. Emulated kernels are built once per source into `built`. inPlace:
// the op's in-place result (OpInfo::inPlaceResult) is written over its operand's buffer, as the memory plan
// lets it when the operand is dead.
int runEmulatedCase(const Case& c, OneOp& o, const NodeLowering& low, const std::string& dir,
                    std::map<std::string, EmuLaunch>& built, bool inPlace = false,
                    const cuda::TcAttnOptions& opt = {}, std::vector<HostTensor>* gotOut = nullptr) {
  std::mt19937 rng(std::hash<std::string>{}(c.name) & 0xffffffff);
  std::vector<HostTensor> in = c.make(rng);
  const uint64_t seed = 4242;
  const int64_t step = 7;
  std::vector<HostTensor> want = runCpu(c, in, seed, step);
  // "Device" buffers in host memory, laid out as on the GPU; results start as NaN bytes.
  std::vector<std::vector<uint8_t>> opBufs, resBufs;
  std::vector<void*> ops, res;
  for (const HostTensor& t : in) opBufs.emplace_back(t.raw(), t.raw() + t.bytes());
  for (const Value* r : o.node->results()) resBufs.emplace_back(static_cast<size_t>(r->type().bytes()) + 8, 0xff);
  for (auto& b : opBufs) ops.push_back(b.data());
  for (auto& b : resBufs) res.push_back(b.data());
  if (inPlace) res[o.node->info().inPlaceResult] = ops[o.node->info().inPlaceOperand];
  std::vector<char> ws(static_cast<size_t>(low.workspaceBytes) + 8, low.zeroWorkspace ? 0 : char(0xff));
  long long stepHost = step;
  for (const KernelSpec& k : low.kernels) {
    INFO(k.entry);
    auto it = built.find(k.source);
    if (it == built.end()) {
      auto fn = compileEmulated(k.source, k.entry, dir, static_cast<int>(built.size()));
      if (!fn.ok()) FAIL(fn.error());
      it = built.emplace(k.source, *fn).first;
    }
    ArgPack pack(k, ops, res, ws.data(), seed, &stepHost);
    it->second(pack.args.data(), k.grid.x, k.grid.y, k.grid.z, k.block.x, k.block.y, k.block.z, k.sharedBytes);
  }
  std::vector<HostTensor> got;
  for (size_t r = 0; r < res.size(); ++r) {
    HostTensor t(o.node->result(r)->type());
    if (t.bytes()) std::memcpy(t.raw(), res[r], t.bytes());
    got.push_back(t);
  }
  if (gotOut) *gotOut = got;
  return compareResults(o, got, want, tcAttentionTol(c, opt));
}

}  // namespace

// Hidden, for developers without a GPU: every case run by the CPU emulation of the CUDA execution model
// (slow: a host compile per kernel, a std::thread per CUDA thread). TPC_EMU_FILTER='a|b' picks cases
// whose names contain a or b.
TEST_CASE("cuda kernels: every family op matches the CPU backend under the CPU emulator", "[.cuda-emu]") {
  const char* filter = std::getenv("TPC_EMU_FILTER");
  TempDir dir;
  std::map<std::string, EmuLaunch> built;
  int compared = 0;
  for (const Case& c : allCases()) {
    if (filter && !matchesAny(c.name, filter)) continue;
    INFO(c.name);
    OneOp o = oneOp(c.op, c.types, c.attrs);
    auto low = lowerCase(c, o);
    REQUIRE(low.ok());
    compared += runEmulatedCase(c, o, *low, dir.path.string(), built);
  }
  CHECK(compared > 0);
}

// Hidden, as above: layer_norm_grad and embedding_grad with the old kernels (oldMembwKernels) against the CPU
// backend, and the new kernels giving the old bits where they should (oldBitsExpected).
TEST_CASE("cuda kernels: the replaced layer_norm_grad and embedding_grad kernels and the new ones' bits under the CPU emulator",
          "[.cuda-emu]") {
  const char* filter = std::getenv("TPC_EMU_FILTER");
  TempDir dir;
  std::map<std::string, EmuLaunch> built;
  int compared = 0, sameBits = 0;
  for (const Case& c : allCases()) {
    if (!hasOldVariant(c) || (filter && !matchesAny(c.name, filter))) continue;
    INFO(c.name);
    OneOp o = oneOp(c.op, c.types, c.attrs);
    auto low = lowerCase(c, o), old = lowerCase(c, o, oldMembwKernels());
    REQUIRE(low.ok());
    REQUIRE(old.ok());
    std::vector<HostTensor> gotNew, gotOld;
    compared += runEmulatedCase(c, o, *low, dir.path.string(), built, false, {}, &gotNew);
    compared += runEmulatedCase(c, o, *old, dir.path.string(), built, false, {}, &gotOld);
    std::mt19937 rng(std::hash<std::string>{}(c.name) & 0xffffffff);
    std::vector<HostTensor> in = c.make(rng);
    sameBits += checkOldBits(*o.node, in, gotNew, gotOld);
  }
  CHECK(compared > 0);
  CHECK(sameBits > 0);
}

// Hidden, as above: layer_norm_grad's rows through the cp.async ring (LoweringContext::layerNormGradStages)
// give the register prefetch's bits in every result. (The emulator lands a copy at once, so this checks the
// ring's indexing, not its waits; the GPU test runs the same comparison.)
TEST_CASE("cuda kernels: layer_norm_grad's ring of rows gives the register prefetch's bits under the CPU emulator",
          "[.cuda-emu]") {
  const char* filter = std::getenv("TPC_EMU_FILTER");
  TempDir dir;
  std::map<std::string, EmuLaunch> built;
  int compared = 0, allResults = 0;
  for (const Case& c : allCases()) {
    if (c.op != OpKind::LayerNormGrad || (c.ctx.layerNormGradStages == 0 && !c.ctx.layerNormGradWide) ||
        (filter && !matchesAny(c.name, filter)))
      continue;
    INFO(c.name);
    OneOp o = oneOp(c.op, c.types, c.attrs);
    auto l = ringAndRegisterLowerings(c, o);
    if (!l) continue;  // element loads or a width without the ring: no ring
    std::vector<HostTensor> a, b;
    compared += runEmulatedCase(c, o, l->ring, dir.path.string(), built, false, {}, &a);
    runEmulatedCase(c, o, l->regs, dir.path.string(), built, false, {}, &b);
    allResults += checkRingBits(*l, a, b);
  }
  CHECK(compared > 0);
  CHECK(allResults > 0);
}

// Hidden, as above: the kernels that may write a result over an operand (OpInfo::inPlaceResult: dlogits over
// the logits) doing so.
TEST_CASE("cuda kernels: in-place kernels match the CPU backend under the CPU emulator when they write in place",
          "[.cuda-emu]") {
  const char* filter = std::getenv("TPC_EMU_FILTER");
  TempDir dir;
  std::map<std::string, EmuLaunch> built;
  int compared = 0;
  for (const Case& c : allCases()) {
    if (opInfo(c.op).inPlaceResult < 0 || (filter && !matchesAny(c.name, filter))) continue;
    INFO(c.name);
    OneOp o = oneOp(c.op, c.types, c.attrs);
    auto low = lowerCase(c, o);
    REQUIRE(low.ok());
    compared += runEmulatedCase(c, o, *low, dir.path.string(), built, true);
  }
  CHECK(compared > 0);
}

// Hidden, as above: the tensor-core attention variants that do not ship (tcAttentionVariants) on every
// "tc" case under the emulator (TPC_EMU_FILTER applies too).
TEST_CASE("cuda kernels: every tensor-core attention variant matches the CPU backend under the CPU emulator",
          "[.cuda-emu]") {
  const char* filter = std::getenv("TPC_EMU_FILTER");
  TempDir dir;
  std::map<std::string, EmuLaunch> built;
  int compared = 0;
  for (const TcVariant& v : tcAttentionVariants())
    for (const Case& c : allCases()) {
      if (!isTcAttentionCase(c) || (filter && !matchesAny(c.name, filter))) continue;
      INFO(v.name << ": " << c.name);
      OneOp o = oneOp(c.op, c.types, c.attrs);
      auto low = lowerTcVariant(o, v.opt);
      REQUIRE(low.ok());
      compared += runEmulatedCase(c, o, *low, dir.path.string(), built, false, v.opt);
    }
  CHECK(compared > 0);
}

#endif  // TPC_HAVE_CUDA
