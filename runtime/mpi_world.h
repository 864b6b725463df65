// One process per rank, started by `mpirun -np N tpc run ...`: OpenMPI (libmpi.so.40), loaded with dlopen
// on first use so that tpc builds and runs without it. tpc uses MPI only on the host: to learn its rank,
// to build sub-communicators, and to exchange bytes (the CPU backend's collectives across processes, the
// gathering of state for checkpoints).
#pragma once

#include <cstdint>
#include <string>

#include "ir/status.h"

namespace tpc::mpi {

// Whether this process was started by OpenMPI's mpirun (OMPI_COMM_WORLD_SIZE is set), and that size
// (1 otherwise).
bool launchedByMpirun();
int64_t launcherWorldSize();
// This process's index among the job's processes on its machine (OMPI_COMM_WORLD_LOCAL_RANK; 0 otherwise):
// the GPU it drives.
int64_t launcherLocalRank();

// An MPI communicator (MPI_Comm), opaque.
struct Comm {
  void* handle = nullptr;
};

// MPI_Init (once per process; later calls return the same answer) and this process's place in
// MPI_COMM_WORLD. An error names the library and how to get it when libmpi.so.40 cannot be loaded.
struct World {
  int64_t rank = 0, size = 1;
  Comm comm;
};
Result<World> init();

// Splits `parent` as MPI_Comm_split: processes with the same color form a communicator, ordered by key.
Result<Comm> split(Comm parent, int64_t color, int64_t key);
// Every process of `c` contributes `bytes` bytes; out (size * bytes) receives them in rank order.
Status allGather(Comm c, const void* in, int64_t bytes, void* out);
// Ends every process of the job (after a failure on one of them, so that the others do not wait forever).
[[noreturn]] void abortAll(int code);
// MPI_Finalize, where init() succeeded.
void finalize();

}  // namespace tpc::mpi
