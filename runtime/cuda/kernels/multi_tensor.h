// Multi-tensor kernels (apex's multi_tensor_apply): one launch over many tensors, each tensor's elements cut
// into chunks of a fixed size. A kernel finds a chunk's tensor in a table of sizes baked into its source and
// the tensor's addresses in a device table the executor writes once at prepare (ArgKind::Table). Shared by
// the multi-tensor AdamW (optimizer.cpp) and the multi-tensor cast (multi_tensor.cpp, cast_groups.h).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "runtime/cuda/kernel_spec.h"

namespace tpc::cuda {

// CUDA C defining NT (the tensors), CHUNK, tpc_first[NT + 1] (each tensor's first chunk; the last entry is
// the number of chunks), tpc_numel[NT], and `int tpc_tensor_of(i64 chunk)` (the tensor a chunk belongs to).
// Needs the device prelude before it.
std::string multiTensorChunks(const std::vector<int64_t>& numel, int64_t chunk);
int64_t multiTensorChunkCount(const std::vector<int64_t>& numel, int64_t chunk);

// The entries of a device address table: for each of `tensors` tensors, its `operands` operands (group inputs
// operands * t ...) then its `results` results (group outputs results * t ...).
std::vector<KernelArg> multiTensorAddressTable(int64_t tensors, int64_t operands, int64_t results);

}  // namespace tpc::cuda
