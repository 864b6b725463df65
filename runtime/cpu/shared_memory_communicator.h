// The in-process Communicator: N ranks of one mesh as N threads of one process, exchanging data through
// shared memory. Collectives block until every rank of their group arrives, up to a timeout; a timeout or
// a failed rank aborts the whole mesh so that no rank waits forever.
#pragma once

#include <chrono>
#include <memory>
#include <vector>

#include "ir/mesh.h"
#include "runtime/cpu/communicator.h"

namespace tpc::cpu {

// One communicator per rank of `mesh`, indexed by rank (row-major over mesh.axes, the last axis fastest:
// for mesh(dp=2, tp=4), rank = dp * 4 + tp). They share one state; each must be used by one thread at a
// time. A collective that does not complete within `timeout` returns an Error naming the rank, the op,
// the axis, the step and the ranks that never arrived, and aborts the mesh (every other rank's pending or
// next collective returns an error too) until reset().
std::vector<std::shared_ptr<Communicator>> createMeshCommunicators(
    const Mesh& mesh, std::chrono::milliseconds timeout = std::chrono::seconds(60));

// Rank r's coordinate on every mesh axis (in mesh order), and back.
std::vector<int64_t> meshCoords(const Mesh& mesh, int64_t rank);
int64_t meshRank(const Mesh& mesh, const std::vector<int64_t>& coords);
// "rank 5 (dp=1, tp=1)"
std::string rankName(const Mesh& mesh, int64_t rank);

}  // namespace tpc::cpu
