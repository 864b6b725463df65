// CUDA lowering without a GPU (runs in CI): every op of ops.def lowers (matmul: cuBLASLt, planned on the
// GPU, so only its graph is checked here), and every generated kernel source, the virtual-rank collective
// kernels included, compiles with NVRTC for sm_90. Also the memory planner and the kernel cache.
#ifdef TPC_HAVE_CUDA
#include <catch2/catch.hpp>

#include <algorithm>
#include <map>
#include <numeric>
#include <random>
#include <set>

#include "graph_text_support.h"
#include "ir/parser.h"
#include "runtime/cuda/lowering.h"
#include "runtime/cuda/memory_plan.h"
#include "runtime/cuda/nvrtc_compiler.h"
#include "runtime/cuda/virtual_collectives.h"
#include "test_support.h"
#include "cuda_op_cases.h"

namespace tpc {
namespace {

using namespace cuda;

// Compiles each distinct source once; returns the failures.
std::vector<std::string> compileAll(NvrtcCompiler& nvrtc, const std::vector<std::pair<std::string, KernelSpec>>& ks) {
  std::vector<std::string> failed;
  std::set<std::string> seen;
  for (const auto& [what, k] : ks) {
    if (!seen.insert(k.source).second) continue;
    auto r = nvrtc.compile(k.source, k.entry);
    if (!r.ok()) failed.push_back(what + ": " + r.error());
    else if (r->empty()) failed.push_back(what + ": empty cubin");
  }
  return failed;
}

}  // namespace

TEST_CASE("cuda lowering: every op lowers and every generated kernel compiles with NVRTC for sm_90", "[cuda]") {
  test::TempDir cache;
  NvrtcCompiler nvrtc(90, cache.path.string());
  LoweringContext ctx;
  std::vector<std::pair<std::string, KernelSpec>> kernels;
  std::set<OpKind> covered;
  std::vector<std::string> failed;
  for (const testing::OpCase& c : testing::cudaOpCases()) {
    std::string what = cat(opName(c.op), " ", c.label);
    auto g = testing::buildOpCase(c);
    if (!g.ok()) {
      failed.push_back(what + ": building the graph: " + g.error());
      continue;
    }
    covered.insert(c.op);
    const Node& n = **(*g)->nodes().begin();
    if (nodeExec(n) == NodeExec::Matmul) continue;
    auto l = lowerNode(n, ctx);
    if (!l.ok()) {
      failed.push_back(what + ": " + l.error());
      continue;
    }
    if (l->kernels.empty()) failed.push_back(what + ": no kernel");
    for (const KernelSpec& k : l->kernels) {
      if (k.block.x * k.block.y * k.block.z == 0 || k.block.x * k.block.y * k.block.z > 1024 || k.grid.x == 0)
        failed.push_back(cat(what, ": bad launch geometry for ", k.entry));
      if (k.source.find(k.entry) == std::string::npos) failed.push_back(cat(what, ": ", k.entry, " is not in its source"));
      kernels.push_back({what, k});
    }
  }
  for (const OpInfo& op : allOps()) {
    INFO(op.name);
    CHECK(covered.count(op.kind));
  }
  // The virtual-rank collectives (several ranks on one GPU).
  for (int G : {2, 4}) {
    kernels.push_back({cat("virtual all_reduce sum G=", G), virtualAllReduce(DType::f32, G, false, 100)});
    kernels.push_back({cat("virtual all_reduce max G=", G), virtualAllReduce(DType::f32, G, true, 100)});
    kernels.push_back({cat("virtual reduce_scatter G=", G), virtualReduceScatter(DType::f32, G, false, {8, 12}, 1, 1)});
    kernels.push_back({cat("virtual all_gather piece G=", G), virtualAllGatherPiece(DType::bf16, {8, 3}, {8, 3 * G}, 1, 1)});
    kernels.push_back({cat("virtual all_gather G=", G), virtualAllGather(DType::bf16, G, {8, 3, 5}, 1)});
  }
  auto compileFailures = compileAll(nvrtc, kernels);
  failed.insert(failed.end(), compileFailures.begin(), compileFailures.end());
  for (const std::string& f : failed) UNSCOPED_INFO(f);
  CHECK(failed.empty());
  WARN(kernels.size() << " kernels, " << nvrtc.stats().compiled << " distinct sources compiled in " << nvrtc.stats().seconds << "s");
  // Compiling again comes from the on-disk cache.
  NvrtcCompiler again(90, cache.path.string());
  compileAll(again, kernels);
  CHECK(again.stats().compiled == 0);
  CHECK(again.stats().cacheHits == nvrtc.stats().compiled);
}

TEST_CASE("cuda lowering: attention copies that differ only in their dropout block share one kernel source", "[cuda]") {
  // Gradient accumulation copies the forward per micro-batch, each copy's attention at another offset of the mask's
  // [B, H] index space (passes/random_space.h). The offset is a kernel argument, so the copies compile once.
  LoweringContext ctx;
  for (OpKind op : {OpKind::Attention, OpKind::AttentionGrad}) {
    for (DType dt : {DType::f32, DType::bf16}) {
      INFO(opName(op) << " " << dtypeName(dt));
      std::vector<NodeLowering> copies;
      for (int64_t copy = 0; copy < 2; ++copy) {
        Graph g("g");
        auto t = [&](Shape s) { return TensorType(dt, std::move(s)); };
        std::vector<Value*> ops;
        for (int i = 0; i < (op == OpKind::Attention ? 3 : 5); ++i) ops.push_back(g.addInput(cat("x", i), t({2, 2, 16, 64})));
        if (op == OpKind::AttentionGrad) ops.push_back(g.addInput("lse", TensorType(DType::f32, {2, 2, 16})));
        AttrDict a;
        a.set("dropout", 0.1);
        a.set("key", int64_t(7));
        a.set("global_shape", std::vector<int64_t>{4, 2});
        a.set("offsets", std::vector<int64_t>{2 * copy, 0});
        auto n = g.create(op, ops, a);
        REQUIRE(n.ok());
        auto l = lowerNode(**n, ctx);
        REQUIRE(l.ok());
        copies.push_back(std::move(*l));
      }
      REQUIRE(copies[0].kernels.size() == copies[1].kernels.size());
      bool argsDiffer = false;
      for (size_t k = 0; k < copies[0].kernels.size(); ++k) {
        const KernelSpec &a = copies[0].kernels[k], &b = copies[1].kernels[k];
        CHECK(a.source == b.source);
        REQUIRE(a.args.size() == b.args.size());
        for (size_t i = 0; i < a.args.size(); ++i)
          argsDiffer |= a.args[i].kind == ArgKind::Int64 && a.args[i].i != b.args[i].i;
      }
      CHECK(argsDiffer);  // the block's offset, 0 and 2
    }
  }
}

TEST_CASE("cuda lowering: an NVRTC compile error keeps the source and names its path", "[cuda]") {
  test::TempDir cache;
  NvrtcCompiler nvrtc(90, cache.path.string());
  auto r = nvrtc.compile("extern \"C\" __global__ void broken(float* x) { x[0] = undefined_name; }", "broken");
  REQUIRE(!r.ok());
  CHECK(r.error().find("undefined_name") != std::string::npos);
  size_t at = r.error().find(cache.path.string());
  REQUIRE(at != std::string::npos);
  std::string path = r.error().substr(at, r.error().find(".cu", at) + 3 - at);
  CHECK(test::readFile(path).find("undefined_name") != std::string::npos);
}

namespace {

using test::namedValue;
using test::parseTestGraph;

}  // namespace

TEST_CASE("cuda lowering: pure views are reshapes and movements that keep the bytes in order", "[cuda]") {
  auto g = parseTestGraph(R"(graph @v(%x: f32[4,1,6], %y: f32[1,4,6]) {
  %r = reshape(%x) {shape=[24]} : f32[24]
  %t1 = transpose(%x) {perm=[1,0,2]} : f32[1,4,6]
  %t2 = transpose(%x) {perm=[2,1,0]} : f32[6,1,4]
  %s1 = slice(%y) {axis=1, start=0, end=2} : f32[1,2,6]
  %s2 = slice(%y) {axis=1, start=1, end=3} : f32[1,2,6]
  %s3 = slice(%y) {axis=2, start=0, end=3} : f32[1,4,3]
  %c = concat(%x) {axis=0} : f32[4,1,6]
  %b1 = broadcast_to(%x) {shape=[1,4,1,6]} : f32[1,4,1,6]
  %b2 = broadcast_to(%x) {shape=[4,3,6]} : f32[4,3,6]
  return %r, %t1, %t2, %s1, %s2, %s3, %c, %b1, %b2
})");
  std::map<std::string, bool> want = {{"r", true},   {"t1", true}, {"t2", false}, {"s1", true}, {"s2", false},
                                      {"s3", false}, {"c", true},  {"b1", true},  {"b2", false}};
  for (const auto& [name, view] : want) {
    INFO(name);
    const Node& n = *namedValue(*g, name)->def();
    CHECK(isView(n) == view);
    CHECK((nodeExec(n) == NodeExec::View) == view);
  }
}

TEST_CASE("cuda memory plan: a view aliases its operand's buffer, which lives until the view's last use", "[cuda]") {
  auto g = parseTestGraph(R"(graph @views(%x: f32[4,64]) {
  %a = exp(%x) : f32[4,64]
  %r = reshape(%a) {shape=[256]} : f32[256]
  %u = reshape(%r) {shape=[16,16]} : f32[16,16]
  %t = transpose(%a) {perm=[1,0]} : f32[64,4]
  %n1 = neg(%t) : f32[64,4]
  %n2 = tanh(%n1) : f32[64,4]
  %b = neg(%u) : f32[16,16]
  %xr = reshape(%x) {shape=[256]} : f32[256]
  %c = exp(%xr) : f32[256]
  return %b, %n2, %c, out=%u
})");
  StepMemoryPlan plan = planStepMemory(*g, std::vector<int64_t>(g->numNodes(), 0));
  const Value *a = namedValue(*g, "a"), *r = namedValue(*g, "r"), *u = namedValue(*g, "u"), *x = g->inputs()[0];
  // Views own no buffer; a chain of views aliases the first value that owns memory (an input too).
  CHECK(plan.viewOf.lookup(r) == a);
  CHECK(plan.viewOf.lookup(u) == a);
  CHECK(plan.viewOf.lookup(namedValue(*g, "xr")) == x);
  CHECK(plan.viewOf.size() == 3);
  for (const Value* v : {r, u, namedValue(*g, "xr")}) CHECK(!plan.bufferOf.count(v));
  CHECK(plan.bufferOf.count(namedValue(*g, "t")));  // a transpose that moves data is a copy
  // %a is read through %u by %b (node 6) and returned as `out` (through %u): it lives to the end.
  const PlannedBuffer& ab = plan.buffers[plan.bufferOf.lookup(a)];
  CHECK(ab.first == 0);
  CHECK(ab.last == static_cast<int>(g->numNodes()));
  // So nothing that is live meanwhile shares its bytes.
  for (const char* other : {"t", "n1", "n2", "b", "c"}) {
    INFO(other);
    const PlannedBuffer& ob = plan.buffers[plan.bufferOf.lookup(namedValue(*g, other))];
    CHECK((ob.offset >= ab.offset + ab.bytes || ob.offset + ob.bytes <= ab.offset));
  }
  // 9 results, 3 of them views: 6 buffers.
  CHECK(plan.buffers.size() == 6);
}

TEST_CASE("cuda memory plan: a parameter read through a view after its update is not updated in place", "[cuda]") {
  // %w's update reads %w at node 1; a view of the old %w is read at node 2: in place would clobber it.
  auto late = parseTestGraph(R"(graph @late(%g: f32[8]) params(%w: f32[8] init=zeros, %v: f32[8] init=zeros) {
  %wr = reshape(%w) {shape=[2,4]} : f32[2,4]
  %w2 = sub(%w, %g) : f32[8]
  %s = neg(%wr) : f32[2,4]
  %v2 = add(%v, %g) : f32[8]
  %vr = reshape(%v2) {shape=[2,4]} : f32[2,4]
  return %s, %vr, w=%w2, v=%v2
})");
  StepMemoryPlan plan = planStepMemory(*late, std::vector<int64_t>(late->numNodes(), 0));
  const Value *w2 = namedValue(*late, "w2"), *v2 = namedValue(*late, "v2");
  CHECK(!plan.inPlace.count(w2));
  REQUIRE(plan.paramCopies.size() == 1);
  CHECK(plan.paramCopies[0].first == w2);
  CHECK(plan.paramCopies[0].second == "w");
  // The copied update keeps its buffer to the end; %v's update goes in place, and its view aliases it.
  CHECK(plan.buffers[plan.bufferOf.lookup(w2)].last == static_cast<int>(late->numNodes()));
  CHECK(plan.inPlace.lookup(v2) == "v");
  CHECK(plan.viewOf.lookup(namedValue(*late, "vr")) == v2);
  CHECK(plan.viewOf.lookup(namedValue(*late, "wr")) == namedValue(*late, "w"));

  // Read through the view before the update: in place is safe.
  auto early = parseTestGraph(R"(graph @early(%g: f32[8]) params(%w: f32[8] init=zeros) {
  %wr = reshape(%w) {shape=[2,4]} : f32[2,4]
  %s = neg(%wr) : f32[2,4]
  %w2 = sub(%w, %g) : f32[8]
  return %s, w=%w2
})");
  plan = planStepMemory(*early, std::vector<int64_t>(early->numNodes(), 0));
  CHECK(plan.inPlace.lookup(namedValue(*early, "w2")) == "w");
  CHECK(plan.paramCopies.empty());

  // A parameter returned unchanged through a view is neither copied nor written.
  auto same = parseTestGraph(R"(graph @same(%g: f32[8]) params(%w: f32[8] init=zeros) {
  %wr = reshape(%w) {shape=[8]} : f32[8]
  %s = neg(%g) : f32[8]
  return %s, w=%wr
})");
  plan = planStepMemory(*same, std::vector<int64_t>(same->numNodes(), 0));
  CHECK(plan.inPlace.empty());
  CHECK(plan.paramCopies.empty());
}

TEST_CASE("cuda memory plan: overlapping lifetimes never share bytes, disjoint ones reuse", "[cuda]") {
  std::vector<PlannedBuffer> b = {{1000, 0, 2}, {500, 1, 3}, {1000, 3, 5}, {300, 4, 4}, {2000, 6, 7}};
  int64_t peak = planMemory(b);
  for (size_t i = 0; i < b.size(); ++i)
    for (size_t j = i + 1; j < b.size(); ++j)
      if (b[i].first <= b[j].last && b[j].first <= b[i].last)
        CHECK((b[i].offset + b[i].bytes <= b[j].offset || b[j].offset + b[j].bytes <= b[i].offset));
  // The live sets peak at 1000+500 (t=1..2), 500+1000 (t=3), 1000+300 (t=4), 2000 (t=6): 2048 with alignment.
  CHECK(peak == 2048);
  CHECK(peak < 1000 + 500 + 1000 + 300 + 2000);
}

// planMemory finds the overlapping buffers through an index over time; the plain scan of every placed buffer
// below (the planner before the thirty-first session) must give the same offsets.
TEST_CASE("cuda memory plan: the indexed planner places random buffers as a scan of all placed ones does", "[cuda]") {
  auto scanPlan = [](std::vector<PlannedBuffer>& buffers, int64_t alignment) {
    std::vector<size_t> order(buffers.size());
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return buffers[a].bytes > buffers[b].bytes; });
    auto align = [&](int64_t v) { return (v + alignment - 1) / alignment * alignment; };
    std::vector<size_t> placed;
    int64_t peak = 0;
    for (size_t i : order) {
      PlannedBuffer& b = buffers[i];
      std::vector<std::pair<int64_t, int64_t>> busy;
      for (size_t j : placed) {
        const PlannedBuffer& o = buffers[j];
        if (o.first <= b.last && b.first <= o.last) busy.push_back({o.offset, o.offset + align(std::max<int64_t>(o.bytes, 1))});
      }
      std::sort(busy.begin(), busy.end());
      int64_t at = 0, size = align(std::max<int64_t>(b.bytes, 1));
      for (auto [s, e] : busy) {
        if (at + size <= s) break;
        at = std::max(at, e);
      }
      b.offset = at;
      peak = std::max(peak, at + size);
      placed.push_back(i);
    }
    return peak;
  };
  std::mt19937 rng(31);
  for (int trial = 0; trial < 200; ++trial) {
    const int steps = 1 + static_cast<int>(rng() % 300), count = static_cast<int>(rng() % 400);
    const int64_t alignment = trial % 2 ? 256 : 1;
    std::vector<PlannedBuffer> a;
    for (int k = 0; k < count; ++k) {
      const int first = static_cast<int>(rng() % steps) - (trial % 3 == 0 ? 5 : 0);  // lifetimes may start below 0
      const int len = rng() % 4 == 0 ? static_cast<int>(rng() % steps) : static_cast<int>(rng() % 6);
      const int64_t bytes = rng() % 8 == 0 ? 0 : static_cast<int64_t>(rng() % 5000);  // ties and empty buffers
      a.push_back({bytes, first, first + len});
    }
    std::vector<PlannedBuffer> b = a;
    INFO("trial " << trial << ": " << count << " buffers over " << steps << " steps");
    REQUIRE(planMemory(a, alignment) == scanPlan(b, alignment));
    for (size_t k = 0; k < a.size(); ++k) REQUIRE(a[k].offset == b[k].offset);
  }
}

}  // namespace tpc
#endif
