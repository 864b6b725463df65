// Node shapes that several fold passes match (one rank's program).
#pragma once

#include "ir/graph.h"

namespace tpc {

// reduce_sum over every dim but the last (keepdims false): a bias gradient [N] of a [..., N] value.
bool sumsAllButLast(const Node& n);

}  // namespace tpc
