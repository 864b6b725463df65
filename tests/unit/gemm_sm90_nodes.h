// The matmul_epilogue nodes our sm_90 GEMM kernel takes, for its unit tests (test_gemm_sm90.cpp, and the CPU
// emulation in test_gemm_sm90_emulated.cpp).
#pragma once

#include <catch2/catch.hpp>

#include <memory>
#include <string>

#include "ir/graph.h"

namespace tpc {

struct EpilogueNode {
  std::unique_ptr<Graph> g;
  Node* n = nullptr;
};

// matmul_epilogue(a[rows..., K], b[K, N] or b^T [N, K], third) {epilogue=kind}: gelu_bias takes bias[N] and gives
// %y, %pre; bias takes bias[N] and gives %y; dgelu takes pre[rows..., N] and gives %g. bias_residual is
// {epilogue=bias} with a fourth operand, r[rows..., N]: (a, b, bias, r) -> %y. bgrad_a takes no third operand
// and gives %y, %db (a's column sums, [K]).
inline EpilogueNode epilogueNode(const std::string& kind, Shape a, Shape b, bool transposeB, DType t) {
  EpilogueNode r;
  r.g = std::make_unique<Graph>(kind);
  int64_t N = transposeB ? b[0] : b[1];
  Shape third = {N};
  if (kind == "dgelu" || kind == "dgelu_bgrad") {
    third = a;
    third.back() = N;
  }
  Value* x = r.g->addInput("a", TensorType(t, a));
  Value* w = r.g->addInput("b", TensorType(t, b));
  const bool residual = kind == "bias_residual";
  std::vector<Value*> operands = {x, w};
  if (kind != "bgrad_a")
    operands.push_back(r.g->addInput(kind == "gelu_bias" || kind == "bias" || residual ? "bias" : "pre", TensorType(t, third)));
  if (residual) {
    Shape rs = a;
    rs.back() = N;
    operands.push_back(r.g->addInput("r", TensorType(t, rs)));
  }
  AttrDict at;
  at.set("epilogue", residual ? "bias" : kind);
  if (transposeB) at.set("transpose_b", true);
  auto n = r.g->create(OpKind::MatmulEpilogue, operands, at);
  REQUIRE(n.ok());
  r.n = *n;
  if (kind == "dgelu") {
    r.g->addOutput(r.n->result(0), "g");
  } else if (kind == "bias" || residual) {
    r.g->addOutput(r.n->result(0), "y");
  } else if (kind == "dgelu_bgrad" || kind == "bgrad_a") {
    r.g->addOutput(r.n->result(0), "g");
    r.g->addOutput(r.n->result(1), "db");
  } else {
    r.g->addOutput(r.n->result(0), "y");
    r.g->addOutput(r.n->result(1), "pre");
  }
  return r;
}

inline EpilogueNode geluBias(Shape a, Shape b, DType t = DType::bf16, bool transposeB = false) {
  return epilogueNode("gelu_bias", std::move(a), std::move(b), transposeB, t);
}

}  // namespace tpc
