// The CPU Backend over a mesh: N per-rank graphs (the partitioner's output, one per rank, all with the
// same Mesh) run concurrently, a thread and a CpuExecutor per rank, collectives through the shared-memory
// communicator. The state and the batch come in and go out unsharded: the backend slices them per each
// value's Placement and gathers parameters back.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "ir/graph.h"
#include "runtime/backend.h"
#include "runtime/cpu/cpu_executor.h"

namespace tpc {

// Every process of an mpirun job contributes `bytes` bytes of `in`; out (processes * bytes) receives them in rank
// order (mpi::allGather over the world).
using AllGatherWorld = std::function<Status(const void* in, int64_t bytes, void* out)>;

struct CpuMeshOptions {
  // A collective that waits longer than this fails the step with an error naming the rank, op and axis.
  std::chrono::milliseconds collectiveTimeout = std::chrono::seconds(60);
  // Check that every rank returned bit-identical values for each returned (replicated) output.
  bool checkReplicatedOutputs = true;
  // One process per rank (`mpirun -np N tpc run`): this process runs mesh rank `localRank` alone, its
  // collectives through `communicator` (cpu/mpi_communicator.h), and readState() assembles the other ranks'
  // blocks through `allGatherWorld` (every process contributes `bytes` bytes, out gets them in rank order), so
  // every process of the job must read the same state tensors in the same order. -1: every rank in this
  // process, a thread each.
  int64_t localRank = -1;
  std::shared_ptr<cpu::Communicator> communicator;
  AllGatherWorld allGatherWorld;
};

// rankGraphs[r] is rank r's program; ranks are row-major over mesh.axes (the last axis fastest).
// CpuOptions::threads (0: all hardware threads) is split evenly between the ranks, at least 1 each;
// CpuOptions::communicator is ignored (the backend makes one per rank).
//
// prepare(step, state): `step` is not used (the rank graphs were given here; pass the unsharded graph or
//   rank 0's); `state` holds the UNSHARDED value of every parameter of the rank graphs, by name.
// step(inputs, i): the UNSHARDED inputs by name; each rank gets its block per its input's placement.
//   Outputs named like a parameter replace that rank's local parameter; every other output must be
//   replicated (placement R on every axis, or none) and is returned from rank 0.
// readState(name): the unsharded tensor, S(d) blocks concatenated in coordinate order.
// Errors from any rank come back as one Error naming the rank (the root cause when one rank's failure
// made the others abort).
std::unique_ptr<Backend> createCpuMeshBackend(std::vector<std::unique_ptr<Graph>> rankGraphs, CpuOptions options,
                                              CpuMeshOptions meshOptions = {});

// The block of a tensor that `rank` holds under `placement` (R on axes not listed): per dim, its offset
// and size in the unsharded shape `global`. Several axes splitting one dim nest in mesh order (the first
// axis outermost, as in DTensor). P is not a layout of whole values: an error. So is an uneven split.
struct ShardBlock {
  Shape offsets, shape;
};
Result<ShardBlock> shardBlock(llvm::ArrayRef<int64_t> global, const std::optional<Placement>& placement,
                              const Mesh& mesh, int64_t rank);
// The unsharded shape of a local shape under `placement`.
Result<Shape> globalShape(llvm::ArrayRef<int64_t> local, const std::optional<Placement>& placement, const Mesh& mesh);
// Rank `rank`'s block of `global`, and the reverse: writes `local` into its block of `global`.
Result<HostTensor> sliceForRank(const HostTensor& global, const std::optional<Placement>& placement, const Mesh& mesh,
                                int64_t rank);
Status placeIntoGlobal(const HostTensor& local, const std::optional<Placement>& placement, const Mesh& mesh,
                       int64_t rank, HostTensor& global);
// One process per rank: every rank's block of a state tensor, `local` being this process's (blocks are of one
// type under even splits), from the `ranks` processes through allGatherWorld, in rank order.
Result<std::vector<HostTensor>> gatherRankBlocks(const HostTensor& local, int64_t ranks, const AllGatherWorld& allGatherWorld);
// One process per rank: the step's first non-finite value over the job (the earliest in execution order, then
// the lowest rank), from `mine`, this process's own, and the other processes' through allGatherWorld, so that
// every process reports the one a single process running every rank would.
Result<std::optional<NonFiniteValue>> firstNonFiniteOfJob(const std::optional<NonFiniteValue>& mine, int64_t processes,
                                                          const AllGatherWorld& allGatherWorld);

}  // namespace tpc
