// Multi-tensor casts: under mixed precision a step starts by casting each f32 master parameter to bf16 for
// the forward and backward (98 casts in a gpt2 step, most of them launch-bound small kernels). The casts of
// graph inputs and parameters between the same two dtypes run as one kernel (kernels/multi_tensor.h) where
// the first of them ran; the same bits, as a cast rounds exactly once either way.
#pragma once

#include <vector>

#include "ir/fusion_group.h"
#include "ir/graph.h"
#include "llvm/ADT/DenseMap.h"

namespace tpc::cuda {

// A cast group is a FusionGroup whose one member is the first cast, where its kernel runs (the memory plan
// and the executor run a group at its last member), and which absorbs the later casts: their results are
// stored by the group's kernel there, so each one's buffer is live from the group's launch. Layout: inputs[t]
// and outputs[t] are the operand and result of cast t, in program order (the member, then `absorbed`).
bool isCastGroup(const FusionGroup& g);

// The cast groups of `g`: every cast between f32, bf16 and f16 whose operand is a parameter or an input and
// that is in no group of `grouped` (the fusion and AdamW groups) nor marked fusion_group, bucketed by its two
// dtypes; a bucket of one cast stays a plain cast.
std::vector<FusionGroup> castGroups(const Graph& g, const llvm::DenseMap<const Node*, const FusionGroup*>* grouped = nullptr);

}  // namespace tpc::cuda
