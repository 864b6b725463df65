// OpenMPI through dlopen: the few entry points tpc calls and the predefined handles it needs, looked up by
// name (OpenMPI's MPI_COMM_WORLD and MPI_BYTE are the addresses of the globals ompi_mpi_comm_world and
// ompi_mpi_byte). libmpi is opened RTLD_GLOBAL: OpenMPI's own plugins resolve their symbols against it.
#include "runtime/mpi_world.h"

#include <dlfcn.h>

#include <climits>
#include <cstdlib>
#include <mutex>

namespace tpc::mpi {
namespace {

using MpiHandle = void*;
struct Api {
  int (*initialized)(int*);
  int (*init)(int*, char***);
  int (*finalized)(int*);
  int (*finalize)();
  int (*commRank)(MpiHandle, int*);
  int (*commSize)(MpiHandle, int*);
  int (*commSplit)(MpiHandle, int, int, MpiHandle*);
  int (*allgather)(const void*, int, MpiHandle, void*, int, MpiHandle, MpiHandle);
  int (*abort)(MpiHandle, int);
  MpiHandle commWorld, byteType;
};

const char* kLib = "libmpi.so.40";

Result<const Api*> api() {
  static Api a;
  static std::string error;
  static std::once_flag once;
  std::call_once(once, [] {
    void* h = dlopen(kLib, RTLD_NOW | RTLD_GLOBAL);
    if (!h) {
      error = cat("cannot load ", kLib, " (OpenMPI 4 or 5; apt-get install openmpi-bin, or add its lib folder to "
                  "LD_LIBRARY_PATH): ", dlerror());
      return;
    }
    auto sym = [&](const char* name) -> void* {
      void* p = dlsym(h, name);
      if (!p && error.empty()) error = cat(kLib, " has no symbol ", name, " (tpc needs OpenMPI's ABI)");
      return p;
    };
    a.initialized = reinterpret_cast<int (*)(int*)>(sym("MPI_Initialized"));
    a.init = reinterpret_cast<int (*)(int*, char***)>(sym("MPI_Init"));
    a.finalized = reinterpret_cast<int (*)(int*)>(sym("MPI_Finalized"));
    a.finalize = reinterpret_cast<int (*)()>(sym("MPI_Finalize"));
    a.commRank = reinterpret_cast<int (*)(MpiHandle, int*)>(sym("MPI_Comm_rank"));
    a.commSize = reinterpret_cast<int (*)(MpiHandle, int*)>(sym("MPI_Comm_size"));
    a.commSplit = reinterpret_cast<int (*)(MpiHandle, int, int, MpiHandle*)>(sym("MPI_Comm_split"));
    a.allgather = reinterpret_cast<int (*)(const void*, int, MpiHandle, void*, int, MpiHandle, MpiHandle)>(
        sym("MPI_Allgather"));
    a.abort = reinterpret_cast<int (*)(MpiHandle, int)>(sym("MPI_Abort"));
    a.commWorld = sym("ompi_mpi_comm_world");
    a.byteType = sym("ompi_mpi_byte");
  });
  if (!error.empty()) return makeError(error);
  return &a;
}

#define MPI_TRY(call, what)                                                   \
  do {                                                                        \
    if (int rc_ = (call); rc_ != 0) return makeError("MPI: ", what, " failed (error ", rc_, ")"); \
  } while (0)

bool initDone = false;

}  // namespace

bool launchedByMpirun() { return std::getenv("OMPI_COMM_WORLD_SIZE") != nullptr; }

int64_t launcherWorldSize() {
  const char* s = std::getenv("OMPI_COMM_WORLD_SIZE");
  return s ? std::atoll(s) : 1;
}

int64_t launcherLocalRank() {
  const char* s = std::getenv("OMPI_COMM_WORLD_LOCAL_RANK");
  return s ? std::atoll(s) : 0;
}

Result<World> init() {
  TPC_ASSIGN(const Api* a, api());
  int done = 0;
  MPI_TRY(a->initialized(&done), "MPI_Initialized");
  if (!done) MPI_TRY(a->init(nullptr, nullptr), "MPI_Init");
  initDone = true;
  World w;
  w.comm.handle = a->commWorld;
  int r = 0, n = 1;
  MPI_TRY(a->commRank(a->commWorld, &r), "MPI_Comm_rank");
  MPI_TRY(a->commSize(a->commWorld, &n), "MPI_Comm_size");
  w.rank = r;
  w.size = n;
  return w;
}

Result<Comm> split(Comm parent, int64_t color, int64_t key) {
  TPC_ASSIGN(const Api* a, api());
  Comm c;
  MPI_TRY(a->commSplit(parent.handle, static_cast<int>(color), static_cast<int>(key), &c.handle), "MPI_Comm_split");
  return c;
}

Status allGather(Comm c, const void* in, int64_t bytes, void* out) {
  TPC_ASSIGN(const Api* a, api());
  if (bytes > INT_MAX) return makeError("MPI: an all-gather of ", bytes, " bytes a rank is over MPI's 2 GiB count limit");
  const int n = static_cast<int>(bytes);
  MPI_TRY(a->allgather(in, n, a->byteType, out, n, a->byteType, c.handle), "MPI_Allgather");
  return {};
}

void abortAll(int code) {
  auto a = api();
  if (a.ok() && initDone) (*a)->abort((*a)->commWorld, code);
  std::_Exit(code);
}

void finalize() {
  auto a = api();
  if (!a.ok() || !initDone) return;
  int done = 0;
  if ((*a)->finalized(&done) == 0 && !done) (*a)->finalize();
}

}  // namespace tpc::mpi
