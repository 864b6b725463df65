// Fused elementwise kernels without a GPU: every fusion group of a 2-layer GPT training step (fp32 and bf16,
// dropout on) lowers to one kernel that NVRTC compiles for sm_90; the launches per step of gpt2 bf16 with and
// without fusion, counted from the lowerings; and, hidden ([.cuda-emu]), fused kernels on random inputs under
// the CPU emulation of CUDA against the CPU backend (broadcast bias, cast, dropout, gelu_grad, scalar path).
#ifdef TPC_HAVE_CUDA
#include <catch2/catch.hpp>

#include <cctype>
#include <cstring>
#include <map>

#include "cuda_emulator.h"
#include "cuda_kernel_cases.h"
#include "fusion_test_support.h"
#include "ir/parser.h"
#include "runtime/cuda/kernels/generated_lowerings.h"
#include "runtime/cuda/lowering.h"
#include "runtime/cuda/nvrtc_compiler.h"
#include "test_support.h"
#include "worst_error.h"

using namespace tpc;
using namespace tpc::cuda;

namespace {

// Parameters in the entry's signature.
int countParams(const KernelSpec& k) {
  size_t at = k.source.find(k.entry + "(");
  if (at == std::string::npos) return -1;
  int depth = 0, n = 0;
  for (size_t i = at + k.entry.size(); i < k.source.size(); ++i) {
    char ch = k.source[i];
    if (ch == '(') ++depth;
    else if (ch == ')' && --depth == 0) break;
    else if (ch == ',' && depth == 1) ++n;
  }
  return n + 1;
}

// The launches one step of `g` makes on the CUDA backend (one rank, no mesh), from the lowerings as
// CudaBackend::prepare builds them: a fusion group's one kernel, a matmul's one cuBLASLt call, a node's
// kernels and workspace memset, and a copy per output that cannot update its parameter in place.
int64_t launchesPerStep(const Graph& g) {
  auto groups = fusionGroups(g);
  REQUIRE(groups.ok());
  std::map<const Node*, const FusionGroup*> groupOf;
  for (const FusionGroup& fg : *groups)
    for (const Node* m : fg.members) groupOf[m] = &fg;
  std::map<const Node*, int> index;
  std::map<const Value*, int> lastUse;
  int k = 0;
  for (const Node* n : g.nodes()) {
    index[n] = k;
    for (const Value* v : n->operands()) lastUse[v] = k;
    ++k;
  }
  int64_t count = 0;
  for (const Node* n : g.nodes()) {
    if (groupOf.count(n)) {
      count += groupOf[n]->members.back() == n;
      continue;
    }
    if (nodeExec(*n) == NodeExec::Matmul) {
      ++count;
      continue;
    }
    auto l = lowerNode(*n, LoweringContext{});
    REQUIRE(l.ok());
    count += static_cast<int64_t>(l->kernels.size()) + (l->zeroWorkspace && l->workspaceBytes > 0);
  }
  std::map<std::string, const Value*> params;
  for (const Value* p : g.params()) params[p->name()] = p;
  for (size_t i = 0; i < g.outputs().size(); ++i) {
    auto it = params.find(g.outputName(i));
    const Value* v = g.outputs()[i].value;
    if (it == params.end() || v == it->second) continue;
    bool inPlace = v->def() && (v->def()->has(traits::Optimizer) || v->def()->has(traits::Elementwise)) &&
                   (!lastUse.count(it->second) || lastUse[it->second] <= index[v->def()]);
    count += !inPlace;
  }
  return count;
}

std::unique_ptr<Graph> gpt2Step(int64_t micro, bool fuse) {
  auto preset = gptPreset("gpt2");
  REQUIRE(preset.ok());
  TrainConfig c = preset->config;
  c.microBatch = c.globalBatch = micro;
  c.seqLength = 1024;
  auto m = buildGpt(preset->gpt, c);
  REQUIRE(m.ok());
  PassManager pm;
  REQUIRE(pm.addPipeline(std::string("mixed-precision(dtype=bf16),autodiff(clip-grad=1.0, weight-decay=0.1),cse,dce") +
                             (fuse ? ",fuse" : ""),
                         "")
              .ok());
  REQUIRE(pm.run(*m->forward).ok());
  return std::move(m->forward);
}

}  // namespace

TEST_CASE("cuda fusion: every fused kernel of a GPT training step compiles with NVRTC for sm_90", "[cuda]") {
  test::TempDir cache;
  NvrtcCompiler nvrtc(90, cache.path.string());
  for (bool bf16 : {false, true}) {
    INFO((bf16 ? "bf16" : "fp32"));
    auto g = test::fusionGptStep(bf16, true, true);
    auto groups = fusionGroups(*g);
    REQUIRE(groups.ok());
    REQUIRE(!groups->empty());
    int vectorized = 0, dropouts = 0;
    std::set<std::string> compiled;
    for (const FusionGroup& fg : *groups) {
      INFO("fusion_group=" << fg.id);
      auto l = lowerFusionGroup(fg, LoweringContext{});
      REQUIRE(l.ok());
      REQUIRE(l->kernels.size() == 1);
      const KernelSpec& k = l->kernels[0];
      CHECK(k.grid.x >= 1);
      CHECK(k.block.x == 256);
      CHECK(countParams(k) == static_cast<int>(k.args.size()));
      for (const KernelArg& a : k.args) {
        if (a.kind == ArgKind::Operand) CHECK(a.index < static_cast<int64_t>(fg.inputs.size()));
        if (a.kind == ArgKind::Result) CHECK(a.index < static_cast<int64_t>(fg.outputs.size()));
      }
      vectorized += k.entry.rfind("tpc_fused_v", 0) == 0;
      dropouts += k.source.find("tpc_dropout_keep(seed") != std::string::npos;
      if (!compiled.insert(k.source).second) continue;
      auto cubin = nvrtc.compile(k.source, k.entry);
      INFO((cubin.ok() ? std::string() : cubin.error()));
      CHECK(cubin.ok());
    }
    WARN((bf16 ? "bf16" : "fp32") << ": " << groups->size() << " fused kernels (" << vectorized << " vectorized, "
                                  << compiled.size() << " distinct sources)");
    CHECK(vectorized > 0);
    CHECK(dropouts > 0);
  }
}

TEST_CASE("cuda fusion: launches per step of gpt2 bf16, with and without fusion", "[cuda]") {
  // The count without fusion is the one the H200 measured (README: 1390 at micro batch 8), less one per
  // layer_norm_grad (25: two kernels instead of three since the warp-per-row LayerNorm kernels), plus two for
  // embedding_grad (six kernels instead of four since the segment kernels: fill and tiles).
  CHECK(launchesPerStep(*gpt2Step(8, false)) == 1390 - 25 + 2);
  int64_t plain = launchesPerStep(*gpt2Step(16, false)), fused = launchesPerStep(*gpt2Step(16, true));
  WARN("gpt2 bf16 micro batch 16: " << plain << " launches per step without fusion, " << fused << " with");
  CHECK(fused < plain);
}

// Hidden: compiles each kernel with the host compiler (slow). The CPU backend runs the same (fused) graph.
TEST_CASE("cuda fusion: fused kernels match the CPU backend under the CPU emulator", "[.cuda-emu]") {
  struct Program {
    const char* name;
    const char* text;
  };
  const Program programs[] = {
      {"bf16 bias add, gelu, cast, dropout (vector path)", R"(graph @t(%x: bf16[6,64], %b: bf16[64]) {
  %a = add(%x, %b) : bf16[6,64]
  %h = gelu(%a) : bf16[6,64]
  %c = cast(%h) {to=f32} : f32[6,64]
  %d = dropout(%c) {p=0.2, key=5} : f32[6,64]
  return %h, %d
})"},
      {"f32 gelu_grad, scale, column broadcast (scalar path)", R"(graph @t(%dy: f32[5,7], %x: f32[5,7], %z: f32[5,1]) {
  %g = gelu_grad(%dy, %x) : f32[5,7]
  %s = scale(%g) {factor=0.5} : f32[5,7]
  %y = add(%s, %z) : f32[5,7]
  return %y
})"},
      {"f32 scalar operand, sharded dropout, exp (vector path)", R"(graph @t(%x: f32[4,16], %s: f32[]) {
  %m = mul(%x, %s) : f32[4,16]
  %d = dropout(%m) {p=0.3, key=2, global_shape=[8,16], offsets=[4,0]} : f32[4,16]
  %e = exp(%d) : f32[4,16]
  return %m, %e
})"},
      {"bf16 sharded dropout, odd size (scalar path)", R"(graph @t(%x: bf16[3,5], %y: bf16[3,5]) {
  %m = sub(%x, %y) : bf16[3,5]
  %d = dropout(%m) {p=0.5, key=1, global_shape=[3,10], offsets=[0,5]} : bf16[3,5]
  %t = tanh(%d) : bf16[3,5]
  return %t
})"},
  };
  test::TempDir dir;
  int serial = 0, compared = 0, vectorized = 0;
  for (const Program& p : programs) {
    INFO(p.name);
    auto parsed = parseGraph(p.text, "t.tir");
    REQUIRE(parsed.ok());
    Graph& g = **parsed;
    REQUIRE(createFusePass()->run(g).ok());
    auto groups = fusionGroups(g);
    REQUIRE(groups.ok());
    REQUIRE(groups->size() == 1);
    const FusionGroup& fg = groups->front();
    CHECK(fg.members.size() == g.numNodes());
    std::mt19937 rng(std::hash<std::string>{}(p.name) & 0xffffffff);
    std::map<const Value*, HostTensor> in;
    std::vector<HostTensor> cpuIn;
    for (const Value* v : g.inputs()) {
      in[v] = test::kernels::uniformT(v->type(), rng, -2, 2);
      cpuIn.push_back(test::kernels::toCpuInputs({in[v]})[0]);
    }
    const uint64_t seed = 4242;
    const int64_t step = 7;
    CpuOptions opt;
    opt.threads = 2;
    opt.seed = seed;
    auto exec = CpuExecutor::create(g, opt);
    REQUIRE(exec.ok());
    std::vector<const HostTensor*> ptrs;
    for (const HostTensor& t : cpuIn) ptrs.push_back(&t);
    auto want = (*exec)->run(ptrs, {}, step);
    REQUIRE(want.ok());
    auto l = lowerFusionGroup(fg, LoweringContext{});
    REQUIRE(l.ok());
    const KernelSpec& k = l->kernels[0];
    vectorized += k.entry.rfind("tpc_fused_v", 0) == 0;
    std::vector<void*> ops, res;
    std::vector<std::vector<uint8_t>> resBufs;
    for (const Value* v : fg.inputs) ops.push_back(const_cast<uint8_t*>(in[v].raw()));
    for (const Value* v : fg.outputs) resBufs.emplace_back(static_cast<size_t>(v->type().bytes()) + 16, 0xff);
    for (auto& b : resBufs) res.push_back(b.data());
    auto fn = test::compileEmulated(k.source, k.entry, dir.path.string(), serial++);
    if (!fn.ok()) FAIL(fn.error());
    long long stepHost = step;
    test::kernels::ArgPack pack(k, ops, res, nullptr, seed, &stepHost);
    (*fn)(pack.args.data(), k.grid.x, k.grid.y, k.grid.z, k.block.x, k.block.y, k.block.z, k.sharedBytes);
    for (size_t o = 0; o < g.outputs().size(); ++o) {
      const Value* v = g.outputs()[o].value;
      size_t at = std::find(fg.outputs.begin(), fg.outputs.end(), v) - fg.outputs.begin();
      REQUIRE(at < fg.outputs.size());
      HostTensor got(v->type());
      std::memcpy(got.raw(), res[at], got.bytes());
      std::vector<double> a = test::values(got), b = test::values((*want)[o]);
      double worst = test::worstRelError(a, b, 1e-6);  // an element left unwritten (0xff: NaN) is infinite
      // The same arithmetic with intermediates rounded as stored; the CPU's libm and formula order may differ
      // by an ulp (one bf16 ulp is 2^-8 relative).
      double tol = v->dtype() == DType::f32 ? 1e-5 : 1e-2;
      WARN(p.name << ": output " << o << " worst relative difference to the CPU " << worst);
      CHECK(worst <= tol);
      ++compared;
    }
  }
  CHECK(compared == 6);
  CHECK(vectorized == 2);
}

// Hidden, as above: a lone elementwise node whose sizes allow it lowers (lowerNode) to the fused kernel's
// 16-byte vector path, one member; it matches the CPU backend; LoweringContext::vectorElementwise = false keeps
// the scalar kernel.
TEST_CASE("cuda fusion: lone elementwise nodes take the vector path and match the CPU backend under the emulator",
          "[.cuda-emu]") {
  const char* programs[] = {
      R"(graph @t(%dy: bf16[6,3072], %x: bf16[6,3072]) {
  %g = gelu_grad(%dy, %x) : bf16[6,3072]
  return %g
})",
      R"(graph @t(%a: bf16[10,768], %b: bf16[10,768]) {
  %s = add(%a, %b) : bf16[10,768]
  return %s
})",
      R"(graph @t(%dy: f32[3,40], %x: f32[3,40]) {
  %g = gelu_grad(%dy, %x) : f32[3,40]
  return %g
})",
      R"(graph @t(%a: bf16[4,24], %b: bf16[24]) {
  %s = mul(%a, %b) : bf16[4,24]
  return %s
})",
  };
  test::TempDir dir;
  int serial = 0, compared = 0;
  for (const char* text : programs) {
    INFO(text);
    auto parsed = parseGraph(text, "t.tir");
    REQUIRE(parsed.ok());
    Graph& g = **parsed;
    const Node& n = *g.nodeVector().front();
    LoweringContext scalar;
    scalar.vectorElementwise = false;
    auto s = lowerNode(n, scalar);
    REQUIRE(s.ok());
    CHECK(s->kernels[0].entry.rfind("tpc_fused", 0) != 0);
    auto l = lowerNode(n, LoweringContext{});
    REQUIRE(l.ok());
    REQUIRE(l->kernels.size() == 1);
    const KernelSpec& k = l->kernels[0];
    CHECK(k.entry.rfind("tpc_fused_v", 0) == 0);
    std::mt19937 rng(17 + serial);
    std::vector<HostTensor> in, cpuIn;
    for (const Value* v : g.inputs()) {
      in.push_back(test::kernels::uniformT(v->type(), rng, -3, 3));
      cpuIn.push_back(test::kernels::toCpuInputs({in.back()})[0]);
    }
    CpuOptions opt;
    opt.threads = 2;
    auto exec = CpuExecutor::create(g, opt);
    REQUIRE(exec.ok());
    std::vector<const HostTensor*> ptrs;
    for (const HostTensor& t : cpuIn) ptrs.push_back(&t);
    auto want = (*exec)->run(ptrs, {}, 1);
    REQUIRE(want.ok());
    std::vector<void*> ops;
    for (HostTensor& t : in) ops.push_back(t.raw());
    std::vector<uint8_t> out(static_cast<size_t>(n.result()->type().bytes()) + 16, 0xff);
    std::vector<void*> res = {out.data()};
    auto fn = test::compileEmulated(k.source, k.entry, dir.path.string(), serial++);
    if (!fn.ok()) FAIL(fn.error());
    long long stepHost = 1;
    test::kernels::ArgPack pack(k, ops, res, nullptr, 0, &stepHost);
    (*fn)(pack.args.data(), k.grid.x, k.grid.y, k.grid.z, k.block.x, k.block.y, k.block.z, k.sharedBytes);
    HostTensor got(n.result()->type());
    std::memcpy(got.raw(), out.data(), got.bytes());
    std::vector<double> a = test::values(got), b = test::values((*want)[0]);
    double worst = test::worstRelError(a, b, 1e-6);  // as above: NaN (unwritten) is infinite
    CHECK(worst <= (n.result()->dtype() == DType::f32 ? 1e-5 : 1e-2));
    ++compared;
  }
  CHECK(compared == 4);
}

#endif  // TPC_HAVE_CUDA
