// Where a Random op's mask is drawn (ir/ops.def): Philox's element index is the row-major index in an index space
// that `global_shape` and `offsets` place the node's own block in. Two passes move that block:
//  - autodiff's gradient accumulation makes a copy of the forward per micro-batch: copy i is block i of `copies`
//    stacked along dim 0 (the batch), so micro 2 x accumulation 2 draws micro 4's masks, and no two micro-batches
//    share one;
//  - partition gives each rank a shard of that block.
// Each composes with what the node already carries.
#pragma once

#include <cstdint>
#include <vector>

#include "ir/graph.h"

namespace tpc {

// The node's own index space: dropout's x shape, attention's [B, H] (Tq and Tk are always whole); empty when the
// node draws nothing (p or dropout 0) or is not a Random op.
std::vector<int64_t> ownRandomSpace(const Node& n);

// Copy `copy` of `copies` (autodiff's micro-batches): `a`, n's attributes, place n's space as block `copy` along dim 0.
void stackRandomSpace(AttrDict& a, const Node& n, int64_t copy, int64_t copies);

// A shard of the node's unsharded own space `unsharded` at `shardOffsets` (partition): `a` places it in the space
// the node already sits in (unsharded itself when global_shape is unset).
void placeRandomShard(AttrDict& a, const std::vector<int64_t>& unsharded, const std::vector<int64_t>& shardOffsets);

}  // namespace tpc
