// The Communicator across processes (`mpirun -np N tpc run ...`, one mesh rank per process): each
// collective all-gathers the group's contributions through MPI and every process combines them in rank
// order, as the shared-memory communicator does, so that a run gives the same bits in one process or in N.
#pragma once

#include <memory>

#include "runtime/cpu/communicator.h"
#include "runtime/mpi_world.h"

namespace tpc::cpu {

// This process's communicator: mesh rank `rank` of `mesh`, which must be the process's rank in `world`
// (world.size == mesh.numRanks()).
Result<std::shared_ptr<Communicator>> createMpiCommunicator(const Mesh& mesh, const mpi::World& world);

}  // namespace tpc::cpu
