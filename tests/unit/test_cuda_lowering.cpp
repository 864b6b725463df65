// CUDA lowering without a GPU (runs in CI): every op of ops.def lowers (matmul: cuBLASLt, planned on the
// GPU, so only its graph is checked here), and every generated kernel source, the virtual-rank collective
// kernels included, compiles with NVRTC for sm_90. Also the memory planner and the kernel cache.
#ifdef TPC_HAVE_CUDA
#include <catch2/catch.hpp>

#include <set>

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
    kernels.push_back({cat("virtual all_gather G=", G), virtualAllGatherPiece(DType::bf16, {8, 3}, {8, 3 * G}, 1, 1)});
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

}  // namespace tpc
#endif
