// Collectives among virtual ranks (several ranks' programs on one GPU): device kernels that read every
// rank's buffer of the group directly. Pointers are passed as Int64 arguments holding device addresses
// (the first G (all_reduce: 2G) Int64 args, in group order), filled in by the executor. Pure, no CUDA calls.
#pragma once

#include <vector>

#include "ir/graph.h"
#include "runtime/cuda/kernel_spec.h"

namespace tpc::cuda {

// For each of the G ranks of a group: out_r = op over q of in_q, summed in rank order (so every rank gets
// bit-identical values). Args: in_0..in_{G-1}, out_0..out_{G-1}, n.
KernelSpec virtualAllReduce(DType t, int groupSize, bool max, int64_t numel);
// Rank r's block of dim `dim` of (op over q of in_q): in shapes `inShape`, out `inShape` with dim / G.
// Args: in_0..in_{G-1}, out, then sizes.
KernelSpec virtualReduceScatter(DType t, int groupSize, bool max, llvm::ArrayRef<int64_t> inShape, int64_t dim, int rank);
// Every rank's gathered output in one launch: out_r's block q of dim `dim` is in_q (a copy of the bits). Args:
// in_0..in_{G-1}, out_0..out_{G-1}, then sizes.
KernelSpec virtualAllGather(DType t, int groupSize, llvm::ArrayRef<int64_t> inShape, int64_t dim);
// Rank q's shard placed into one rank's gathered output (a strided copy). Args: out, in_q, then sizes.
KernelSpec virtualAllGatherPiece(DType t, llvm::ArrayRef<int64_t> inShape, llvm::ArrayRef<int64_t> outShape, int64_t dim,
                                 int q);

}  // namespace tpc::cuda
