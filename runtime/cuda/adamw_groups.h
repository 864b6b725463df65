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
// then lr, step, then the clip scale when the group scales its gradients, then the gates; outputs p', m', v'
// of each member. The gates are the step's "loss" and "grad_norm" outputs (those it has), the values a step
// is judged non-finite by (backend.h). A member's g is what its gradient was computed from when the group
// absorbs the clip multiply mul(g', clip_scale) and the cast g' = cast(g) {to=f32} of a bf16/f16 g (nothing
// else reading them): the kernel multiplies float(g) by the scale, the same f32 product, and the f32 copy
// of every gradient and two launches per parameter are gone.
// With `sixteenBitCopies`, a group may also keep its parameters' 16-bit copies (adamwGroupKeepsCopies): its
// outputs are then p', m', v' and the copy c of each member, where c is the result of the step's cast of p
// to bf16/f16 (a cast a cast group takes). The kernel stores cast(p') there, the bits the next step's cast
// would give, so that cast can be skipped (cast_groups.h); a gated step leaves p and c alike.
bool isAdamWGroup(const FusionGroup& g);
bool adamwGroupKeepsCopies(const FusionGroup& g);
std::vector<Value*> adamwGroupCopies(const FusionGroup& g);  // each member's copy c (none: empty)
bool adamwGroupScales(const FusionGroup& g);  // the clip scale is an input (the group absorbed multiplies)
size_t adamwGroupGates(const FusionGroup& g);

// The groups of `g`: every adamw_update whose gates are computed before the group runs (`fused`: the step's
// elementwise fusion groups, whose values are ready at their last member) and whose results no node reads
// (only graph outputs). An adamw_update left out runs on its own, ungated.
std::vector<FusionGroup> adamwGroups(const Graph& g, const llvm::DenseMap<const Node*, const FusionGroup*>* fused = nullptr,
                                     bool sixteenBitCopies = false);

}  // namespace tpc::cuda
