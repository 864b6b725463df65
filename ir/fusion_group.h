// Fusion groups: elementwise nodes marked with the same `fusion_group=N` (by the fuse pass) run as one
// kernel over one index space (the members' common result shape). Values read only inside the group are
// never stored; the group's results are the member values read by another node or a graph output.
#pragma once

#include <vector>

#include "ir/graph.h"

namespace tpc {

struct FusionGroup {
  int64_t id = -1;
  std::vector<Node*> members;   // program order; the kernel runs at the last one
  std::vector<Value*> inputs;   // values read by members and defined outside the group, first use first
  std::vector<Value*> outputs;  // member results that another node or a graph output reads
  Shape shape;                  // the index space
  // Nodes outside `members` whose work the group's kernel does too, reading their operands as group inputs
  // (the multi-tensor AdamW group's gradient casts and clip multiplies, runtime/cuda/adamw_groups.h; the
  // later casts of a multi-tensor cast group, runtime/cuda/cast_groups.h); they run at the group's last
  // member and their results are stored only when they are group outputs.
  std::vector<Node*> absorbed;
  bool isInternal(const Value* v) const;  // a member or absorbed result that is not an output
};

// The group number of `n` (-1 when it is in none).
int64_t fusionGroupOf(const Node& n);

// The groups of `g` in order of their last member. Errors (a hand-written graph can have them): a member that
// is not elementwise, members of different result shapes, or a node outside the group that reads a member's
// result before the group's last member (the kernel would not have run yet).
Result<std::vector<FusionGroup>> fusionGroups(const Graph& g);

}  // namespace tpc
