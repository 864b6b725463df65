// The verifier: SSA (every operand defined before its use), op arity and attributes, result types equal
// to what the op's shape rule infers, placements valid for the graph's mesh, parameter initializers, fusion
// groups that one kernel can run (ir/fusion_group.h).
#pragma once

#include "ir/status.h"

namespace tpc {

class Graph;
struct Loc;

// Checks the whole graph; the first problem comes back as `file:line:col: error: what` when the graph was
// parsed from text, else as `error: in @graph: <the node>: what`.
Status verifyGraph(const Graph& g);

// Formats a diagnostic at `loc` of graph `g` (or naming `context` when there is no location).
std::string diagnostic(const Graph& g, Loc loc, const std::string& context, const std::string& msg);

}  // namespace tpc
