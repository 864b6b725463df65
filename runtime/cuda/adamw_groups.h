// Multi-tensor AdamW: the step's adamw_update nodes run as one kernel per group of nodes that share what the
// kernel bakes in (dtypes, betas, eps, the lr and step they read), at the group's last member, and that
// kernel leaves the state alone on a non-finite step instead of the backend copying the state aside.
#pragma once

#include <vector>

#include "ir/fusion_group.h"
#include "ir/graph.h"
#include "llvm/ADT/DenseMap.h"

namespace tpc::cuda {

// A group is a FusionGroup, so that the memory plan and the executor treat it as they treat a fusion group
// (its members run at its last one). Its layout: members in program order; inputs p, g, m, v of each member,
// then lr, step, then the gates; outputs p', m', v' of each member. The gates are the step's "loss" and
// "grad_norm" outputs (those it has), the values a step is judged non-finite by (backend.h).
bool isAdamWGroup(const FusionGroup& g);
size_t adamwGroupGates(const FusionGroup& g);

// The groups of `g`: every adamw_update whose gates are computed before the group runs (`fused`: the step's
// elementwise fusion groups, whose values are ready at their last member) and whose results no node reads
// (only graph outputs). An adamw_update left out runs on its own, ungated.
std::vector<FusionGroup> adamwGroups(const Graph& g, const llvm::DenseMap<const Node*, const FusionGroup*>* fused = nullptr);

}  // namespace tpc::cuda
