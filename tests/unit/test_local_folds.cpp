// The folds partition applies to each rank's program (passes/sharding/local_folds.cpp), on hand-written rank
// programs: foldStackedQkv reads megatron-tp's stacked QKV block [D, 3, d] as the packed [D, 3d] matrix and
// gives the same values on the CPU, and leaves a look-alike whose shapes do not line up alone.
#include <catch2/catch.hpp>

#include <random>

#include "cpu_test_helpers.h"
#include "ir/parser.h"
#include "passes/builtin_passes.h"
#include "passes/sharding/sharding.h"

namespace tpc {
namespace {

// A rank's stacked QKV projection (B=2, T=4, D=6, 3 blocks of d=4 = 2 heads of 2) and its three gradients,
// from the heads' gradient gs, as partition leaves them.
const char* kStacked = R"(graph @qkv(%x: f32[2,4,6], %w: f32[6,3,4], %b: f32[3,4], %gs: f32[3,2,2,4,2]) {
  %wt = transpose(%w) {perm=[1,0,2]} : f32[3,6,4]
  %x4 = reshape(%x) {shape=[2,1,4,6]} : f32[2,1,4,6]
  %m = matmul(%x4, %wt) : f32[2,3,4,4]
  %br = reshape(%b) {shape=[1,3,1,4]} : f32[1,3,1,4]
  %a = add(%m, %br) : f32[2,3,4,4]
  %r5 = reshape(%a) {shape=[2,3,4,2,2]} : f32[2,3,4,2,2]
  %heads = transpose(%r5) {perm=[1,0,3,2,4]} : f32[3,2,2,4,2]
  %tb = transpose(%gs) {perm=[1,0,3,2,4]} : f32[2,3,4,2,2]
  %g4 = reshape(%tb) {shape=[2,3,4,4]} : f32[2,3,4,4]
  %db = reduce_sum(%g4) {axes=[0,2]} : f32[3,4]
  %mx = matmul(%g4, %wt) {transpose_b=true} : f32[2,3,4,6]
  %dx = reduce_sum(%mx) {axes=[1]} : f32[2,4,6]
  %mw = matmul(%x4, %g4) {transpose_a=true} : f32[2,3,6,4]
  %sw = reduce_sum(%mw) {axes=[0]} : f32[3,6,4]
  %dw = transpose(%sw) {perm=[1,0,2]} : f32[6,3,4]
  return heads=%heads, db=%db, dx=%dx, dw=%dw
})";

// The backward's shape alone, but the gradient reshaped [B, 3, T h, Dh] (d = 2, not h Dh = 4): a packed
// reading of gs would have the right types and the wrong values.
const char* kMisshapen = R"(graph @qkv(%x: f32[2,8,6], %w: f32[6,3,2], %gs: f32[3,2,2,4,2]) {
  %wt = transpose(%w) {perm=[1,0,2]} : f32[3,6,2]
  %x4 = reshape(%x) {shape=[2,1,8,6]} : f32[2,1,8,6]
  %tb = transpose(%gs) {perm=[1,0,3,2,4]} : f32[2,3,4,2,2]
  %g4 = reshape(%tb) {shape=[2,3,8,2]} : f32[2,3,8,2]
  %db = reduce_sum(%g4) {axes=[0,2]} : f32[3,2]
  %mx = matmul(%g4, %wt) {transpose_b=true} : f32[2,3,8,6]
  %dx = reduce_sum(%mx) {axes=[1]} : f32[2,8,6]
  %mw = matmul(%x4, %g4) {transpose_a=true} : f32[2,3,6,2]
  %sw = reduce_sum(%mw) {axes=[0]} : f32[3,6,2]
  %dw = transpose(%sw) {perm=[1,0,2]} : f32[6,3,2]
  return db=%db, dx=%dx, dw=%dw
})";

std::unique_ptr<Graph> parse(const char* text) {
  auto g = parseGraph(text, "<test>");
  INFO((g.ok() ? std::string() : g.error()));
  REQUIRE(g.ok());
  return std::move(g).value();
}

// foldStackedQkv, then the dead nodes dropped (as partitionForRank does).
void fold(Graph& g) {
  foldStackedQkv(g);
  auto d = createDCEPass()->run(g);
  REQUIRE(d.ok());
}

int count(const Graph& g, OpKind op) {
  int n = 0;
  for (const Node* node : g.nodes()) n += node->op() == op;
  return n;
}

// The graph's outputs on random inputs (the same for every graph with these inputs), on the CPU in f32.
std::vector<HostTensor> run(const Graph& g) {
  std::mt19937 rng(3);
  std::vector<HostTensor> in;
  for (const Value* v : g.inputs()) in.push_back(test::randomTensor(v->type(), rng, false));
  auto out = test::runGraph(g, in, false);
  INFO((out.ok() ? std::string() : out.error()));
  REQUIRE(out.ok());
  return std::move(out).value();
}

void checkClose(const std::vector<HostTensor>& want, const std::vector<HostTensor>& got) {
  REQUIRE(want.size() == got.size());
  for (size_t k = 0; k < want.size(); ++k) {
    INFO("output " << k);
    REQUIRE(got[k].type() == want[k].type());
    std::vector<double> w = test::values(want[k]), g = test::values(got[k]);
    for (size_t i = 0; i < w.size(); ++i) CHECK(std::abs(g[i] - w[i]) <= 1e-5);
  }
}

}  // namespace

TEST_CASE("local folds: the stacked QKV projection and its gradients read the packed block, same values", "[sharding][fold]") {
  auto g = parse(kStacked);
  auto folded = g->clone();
  fold(*folded);
  // One GEMM each way on [B, T, *] x [D, 3d], no per-block sums or weight transposes left.
  CHECK(count(*folded, OpKind::Matmul) == 3);
  for (const Node* n : folded->nodes()) {
    if (n->op() == OpKind::Matmul)
      for (const Value* v : n->operands()) CHECK(v->type().rank() <= 3);  // no [B, 1, T, D] or [B, 3, T, d]
    if (n->op() == OpKind::ReduceSum) CHECK(n->getInts("axes") != std::vector<int64_t>{1});
    if (n->op() == OpKind::Transpose && n->result()->shape() == Shape{3, 2, 2, 4, 2})
      CHECK(n->getInts("perm") == std::vector<int64_t>{2, 0, 3, 1, 4});  // heads from the one-rank layout
    if (n->op() == OpKind::Transpose) CHECK(n->getInts("perm") != std::vector<int64_t>{1, 0, 2});
  }
  checkClose(run(*g), run(*folded));
}

TEST_CASE("local folds: a stacked-QKV look-alike whose gradient is reshaped differently is left alone", "[sharding][fold]") {
  auto g = parse(kMisshapen);
  auto folded = g->clone();
  fold(*folded);
  CHECK(count(*folded, OpKind::Matmul) == count(*g, OpKind::Matmul));
  CHECK(count(*folded, OpKind::ReduceSum) == count(*g, OpKind::ReduceSum));
  CHECK(count(*folded, OpKind::Transpose) == count(*g, OpKind::Transpose));
  checkClose(run(*g), run(*folded));
}

}  // namespace tpc
