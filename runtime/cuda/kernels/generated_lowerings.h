// The lowerings tpc generates itself (as opposed to the hand-written kernel families of
// family_lowerings.h): every elementwise op, movement, constants, and single-rank collectives (a copy).
// Matmul is not here: the executor calls cuBLASLt for it (runtime/cuda/cublaslt_matmul.h).
#pragma once

#include "ir/fusion_group.h"
#include "ir/graph.h"
#include "ir/status.h"
#include "runtime/cuda/kernel_spec.h"

namespace tpc::cuda {

Result<NodeLowering> lowerElementwise(const Node& n, const LoweringContext& ctx);  // elementwise.cpp
// Shared with the fused kernels: op n's expression on x (and y) in compute type C (dropout reads p, scale,
// key, seed, *step and the global index g; scale reads factor; gelu_grad calls gelu_d), the device source of
// gelu_d, and the dtype n computes in.
Result<std::string> elementwiseExpr(const Node& n, const std::string& C);           // elementwise.cpp
const char* geluDerivativeSource();
DType elementwiseComputeDType(const Node& n);
// A fusion group (ir/fusion_group.h) as one kernel: its Operand k is g.inputs[k], its Result k g.outputs[k].
Result<NodeLowering> lowerFusionGroup(const FusionGroup& g, const LoweringContext& ctx);  // fused_elementwise.cpp
Result<NodeLowering> lowerMovement(const Node& n, const LoweringContext& ctx);     // movement.cpp
Result<NodeLowering> lowerFull(const Node& n, const LoweringContext& ctx);         // movement.cpp
// A collective over a mesh axis of size 1: the identity, as a copy.              // movement.cpp
Result<NodeLowering> lowerSingleRankCollective(const Node& n, const LoweringContext& ctx);

}  // namespace tpc::cuda
