// The IR: Graph::create infers and checks types, the verifier catches what the factory cannot (use
// before def, bad placements, wrong declared types), clone is deep, parser errors are one located line.
#include <catch2/catch.hpp>

#include <limits>

#include "ir/graph.h"
#include "ir/parser.h"
#include "ir/printer.h"
#include "ir/verifier.h"
#include "test_support.h"

using namespace tpc;

namespace {


TensorType f32(Shape s) { return TensorType(DType::f32, std::move(s)); }

Node* mustCreate(Graph& g, OpKind op, llvm::ArrayRef<Value*> operands, AttrDict a = {}) {
  auto n = g.create(op, operands, std::move(a));
  if (!n) FAIL(n.error());
  return *n;
}

}  // namespace

TEST_CASE("Graph::create infers result types", "[ir][graph]") {
  Graph g("infer");
  Value* x = g.addInput("x", f32({2, 16, 64}));
  Value* w = g.addParam("w", f32({128, 64}), InitSpec{"normal", {0.02}});
  Value* ids = g.addInput("ids", TensorType(DType::i32, {2, 16}));

  Node* mm = mustCreate(g, OpKind::Matmul, {x, w}, attrs({{"transpose_b", true}}));
  CHECK(mm->result()->type() == f32({2, 16, 128}));
  Node* emb = mustCreate(g, OpKind::Embedding, {w, ids});
  CHECK(emb->result()->type() == f32({2, 16, 64}));
  Node* bias = mustCreate(g, OpKind::Add, {x, g.addInput("b", f32({64}))});
  CHECK(bias->result()->type() == f32({2, 16, 64}));
  Node* red = mustCreate(g, OpKind::ReduceSum, {x}, attrs({{"axes", std::vector<int64_t>{-1}}, {"keepdims", true}}));
  CHECK(red->result()->type() == f32({2, 16, 1}));
  Node* rs = mustCreate(g, OpKind::Reshape, {x}, attrs({{"shape", std::vector<int64_t>{-1, 64}}}));
  CHECK(rs->result()->type() == f32({32, 64}));
  Node* cast = mustCreate(g, OpKind::Cast, {x}, attrs({{"to", DType::bf16}}));
  CHECK(cast->result()->type() == TensorType(DType::bf16, {2, 16, 64}));

  Value* q = g.addInput("q", f32({2, 4, 16, 8}));
  Node* att = mustCreate(g, OpKind::Attention, {q, q, q});
  REQUIRE(att->numResults() == 2);
  CHECK(att->result(0)->type() == f32({2, 4, 16, 8}));
  CHECK(att->result(1)->type() == f32({2, 4, 16}));
  CHECK(att->result(0)->def() == att);
  CHECK(att->result(1)->resultIndex() == 1);
  // Defaults are read through the op table; set attributes win.
  CHECK(att->getBool("causal") == true);
  CHECK(mm->getBool("transpose_b") == true);
  CHECK(mm->getBool("transpose_a") == false);
  CHECK(g.numNodes() == 7);
  CHECK(verifyGraph(g).ok());
}

TEST_CASE("Graph::create reports the user's errors naming the op", "[ir][graph]") {
  Graph g("errors");
  Value* a = g.addInput("a", f32({2, 3}));
  Value* b = g.addInput("b", f32({4}));
  Value* m = g.addInput("m", f32({16, 32}));

  auto add = g.create(OpKind::Add, {a, b});
  REQUIRE_FALSE(add.ok());
  CHECK(add.error() == "add: shapes [2,3] and [4] do not broadcast");

  auto mm = g.create(OpKind::Matmul, {a, m});
  REQUIRE_FALSE(mm.ok());
  CHECK(mm.error() == "matmul: contraction dims differ: f32[2,3] x f32[16,32] (3 vs 16)");

  auto arity = g.create(OpKind::Neg, {a, b});
  REQUIRE_FALSE(arity.ok());
  CHECK(arity.error() == "neg takes 1 operand(s), got 2");

  auto missing = g.create(OpKind::Scale, {a});
  REQUIRE_FALSE(missing.ok());
  CHECK(missing.error() == "scale: missing required attribute 'factor'");

  auto unknownAttr = g.create(OpKind::Neg, {a}, attrs({{"alpha", 1.0}}));
  REQUIRE_FALSE(unknownAttr.ok());
  CHECK(unknownAttr.error() == "neg has no attribute 'alpha' (it takes: fusion_group)");  // every elementwise op takes it (ir/op.cpp)

  auto wrongKind = g.create(OpKind::Scale, {a}, attrs({{"factor", "two"}}));
  REQUIRE_FALSE(wrongKind.ok());
  CHECK(wrongKind.error() == "scale: attribute 'factor' must be a float, got two");

  // Shapes from attributes whose element count overflows int64 (reshape's message showed the wrapped product).
  const int64_t big = std::numeric_limits<int64_t>::max();
  auto reshape = g.create(OpKind::Reshape, {a}, attrs({{"shape", std::vector<int64_t>{big, big}}}));
  REQUIRE_FALSE(reshape.ok());
  CHECK(reshape.error() == "reshape: shape [9223372036854775807,9223372036854775807] has too many elements (the count "
                           "overflows int64)");
  auto broadcast = g.create(OpKind::BroadcastTo, {b}, attrs({{"shape", std::vector<int64_t>{int64_t(1) << 62, 4}}}));
  REQUIRE_FALSE(broadcast.ok());
  CHECK(broadcast.error() == "broadcast_to: result shape [4611686018427387904,4] has too many elements (the count "
                             "overflows int64)");

  // Collectives check their axis against the graph's mesh.
  auto noMesh = g.create(OpKind::AllReduce, {a}, attrs({{"axis", "tp"}}));
  REQUIRE_FALSE(noMesh.ok());
  CHECK(noMesh.error() == "all_reduce: axis 'tp' is not in the graph's mesh (the graph has no mesh(...))");
  g.setMesh(Mesh{{{"tp", 2}}});
  CHECK(g.create(OpKind::AllReduce, {a}, attrs({{"axis", "tp"}})).ok());
  auto scatter = g.create(OpKind::ReduceScatter, {a}, attrs({{"axis", "tp"}, {"dim", 1}}));
  REQUIRE_FALSE(scatter.ok());
  CHECK(scatter.error() == "reduce_scatter: dim 1 of f32[2,3] is not divisible by the tp axis size 2");

  // layer_norm takes a residual of x's type as a fourth operand (fold-layer-norm-residual), nothing else.
  Value* gamma = g.addInput("gamma", f32({3}));
  auto lnTwo = g.create(OpKind::LayerNorm, {a, gamma});
  REQUIRE_FALSE(lnTwo.ok());
  CHECK(lnTwo.error() == "layer_norm: takes (x, gamma, beta) or (x, gamma, beta, residual), got 2 operands");
  auto lnWrongResidual = g.create(OpKind::LayerNorm, {a, gamma, gamma, b});
  REQUIRE_FALSE(lnWrongResidual.ok());
  CHECK(lnWrongResidual.error() == "layer_norm: residual and x must have the same type, got f32[4] and f32[2,3]");

  // A failed create adds nothing.
  CHECK(g.numNodes() == 1);
}

TEST_CASE("the verifier catches a use before its definition", "[ir][verifier]") {
  Graph g("order");
  Value* x = g.addInput("x", f32({4}));
  Node* a = mustCreate(g, OpKind::Neg, {x});
  Node* b = mustCreate(g, OpKind::Exp, {a->result()});
  g.addOutput(b->result());
  REQUIRE(verifyGraph(g).ok());
  g.move(b, a);  // exp now reads neg's result before neg runs
  Status s = verifyGraph(g);
  REQUIRE_FALSE(s.ok());
  // A graph built in code has no source locations: the message names the graph and the node.
  CHECK(s.error() == "error: in @order: %0 = exp(%1) : f32[4]: operand %1 is used before it is defined");
}

TEST_CASE("the verifier checks placements against the mesh and the value's rank", "[ir][verifier]") {
  Graph g("place");
  g.setMesh(Mesh{{{"tp", 2}}});
  Value* x = g.addInput("x", f32({4, 8}));
  Node* n = mustCreate(g, OpKind::Gelu, {x});
  g.addOutput(n->result());

  Placement ok;
  ok.set("tp", AxisPlacement::split(1));
  n->result()->setPlacement(ok);
  CHECK(verifyGraph(g).ok());

  Placement badDim;
  badDim.set("tp", AxisPlacement::split(2));
  n->result()->setPlacement(badDim);
  Status s1 = verifyGraph(g);
  REQUIRE_FALSE(s1.ok());
  CHECK(s1.error() ==
        "error: in @place: %0 = gelu(%x) : f32[4,8] {place=[tp:S(2)]}: placement of %0 splits dim 2, but its type "
        "f32[4,8] has rank 2");

  n->result()->setPlacement(std::nullopt);
  Placement badAxis;
  badAxis.set("dp", AxisPlacement::partial());
  x->setPlacement(badAxis);
  Status s2 = verifyGraph(g);
  REQUIRE_FALSE(s2.ok());
  CHECK(s2.error() == "error: in @place: %x: placement of %x names axis 'dp', but the mesh is mesh(tp=2)");
}

TEST_CASE("the verifier compares declared result types with the inferred ones", "[ir][verifier]") {
  Graph g("declared");
  Value* x = g.addInput("x", f32({4, 8}));
  Node* n = g.createWithTypes(OpKind::Transpose, {x}, attrs({{"perm", std::vector<int64_t>{1, 0}}}), {f32({4, 8})});
  g.addOutput(n->result());
  Status s = verifyGraph(g);
  REQUIRE_FALSE(s.ok());
  CHECK(s.error().find("result %0 is declared f32[4,8] but transpose gives f32[8,4]") != std::string::npos);
  n->result()->setType(f32({8, 4}));
  CHECK(verifyGraph(g).ok());
}

TEST_CASE("clone is a deep copy that prints the same text", "[ir][graph]") {
  for (const char* file : {"tests/ir/gpt_block.tir", "tests/ir/gpt_block_tp2.tir", "tests/ir/adamw_step.tir"}) {
    INFO(file);
    auto g = parseGraphFile(test::sourcePath(file));
    if (!g) FAIL(g.error());
    llvm::DenseMap<const Value*, Value*> map;
    auto c = (*g)->clone(&map);
    CHECK(printGraph(*c) == printGraph(**g));
    CHECK(verifyGraph(*c).ok());
    CHECK(c->mesh() == (*g)->mesh());
    // The map sends every old value to a new one of the clone.
    for (const Node* n : (*g)->nodes())
      for (const Value* r : n->results()) {
        REQUIRE(map.count(r));
        CHECK(map.lookup(r) != r);
        CHECK(map.lookup(r)->def()->graph() == c.get());
      }
    // Changing the clone leaves the original alone.
    std::string before = printGraph(**g);
    c->setName("changed");
    Node* first = *c->nodes().begin();
    first->result()->setName("renamed");
    c->clearOutputs();
    CHECK(printGraph(**g) == before);
  }
}

TEST_CASE("parser errors are one line with file, line and column", "[ir][parser]") {
  struct Case {
    const char* text;
    const char* error;
  };
  const Case cases[] = {
      {"graph @g(%x: f32[2]) {\n  %y = neg(%x) : f32[2]\n  return %y\n}\n", nullptr},
      {"graph @g(%x: f32[2]) {\n  %y = nope(%x) : f32[2]\n  return %y\n}\n", "in.tir:2:8: error: unknown op 'nope'"},
      {"graph @g(%x: f32[2]) {\n  %y = neg(%z) : f32[2]\n  return %y\n}\n",
       "in.tir:2:12: error: use of undefined value %z"},
      {"graph @g(%x: f32[2]) {\n  %y = neg(%x) : f32[2]\n  return %y\n} extra", "in.tir:4:3: error: unexpected 'extra' after the graph (one graph per input)"},
      {"graph @g(%x: f32[2]) {\n\t%y = neg(%x) : f32[2] #\n", "in.tir:2:24: error: unexpected character '#'"},
  };
  for (const Case& c : cases) {
    INFO(c.text);
    auto g = parseGraph(c.text, "in.tir");
    if (!c.error) {
      CHECK(g.ok());
      continue;
    }
    REQUIRE_FALSE(g.ok());
    CHECK(g.error().find('\n') == std::string::npos);
    CHECK(g.error() == c.error);
  }
  // Declared dtype that differs from the inferred one.
  auto g = parseGraph("graph @g(%x: f32[2]) {\n  %y = neg(%x) : i32[2]\n  return %y\n}\n", "in.tir");
  REQUIRE_FALSE(g.ok());
  CHECK(g.error() == "in.tir:2:8: error: result %y is declared i32[2] but neg gives f32[2]");
  // A missing file names the path.
  auto missing = parseGraphFile("/nonexistent/dir/x.tir");
  REQUIRE_FALSE(missing.ok());
  CHECK(missing.error() == "/nonexistent/dir/x.tir: error: cannot open file: No such file or directory");
}
