// The lowerings tpc generates itself (as opposed to the hand-written kernel families of
// family_lowerings.h): every elementwise op, movement, constants, and single-rank collectives (a copy).
// Matmul is not here: the executor calls cuBLASLt for it (runtime/cuda/cublaslt_matmul.h).
#pragma once

#include "ir/graph.h"
#include "ir/status.h"
#include "runtime/cuda/kernel_spec.h"

namespace tpc::cuda {

Result<NodeLowering> lowerElementwise(const Node& n, const LoweringContext& ctx);  // elementwise.cpp
Result<NodeLowering> lowerMovement(const Node& n, const LoweringContext& ctx);     // movement.cpp
Result<NodeLowering> lowerFull(const Node& n, const LoweringContext& ctx);         // movement.cpp
// A collective over a mesh axis of size 1: the identity, as a copy.              // movement.cpp
Result<NodeLowering> lowerSingleRankCollective(const Node& n, const LoweringContext& ctx);

}  // namespace tpc::cuda
