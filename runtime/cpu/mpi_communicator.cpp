// MpiCommunicator: a sub-communicator per mesh axis (MPI_Comm_split: the processes sharing every other
// coordinate, ordered by their coordinate on the axis); each collective first all-gathers a header (kind,
// element type, op, count) so that processes running different programs fail with an error naming both,
// then the data, then combines in rank order.
#include "runtime/cpu/mpi_communicator.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "runtime/cpu/shared_memory_communicator.h"

namespace tpc::cpu {
namespace {

struct Header {
  int32_t kind = 0, elem = 0, op = 0, pad = 0;
  int64_t n = 0;
  bool operator==(const Header& o) const { return kind == o.kind && elem == o.elem && op == o.op && n == o.n; }
};
const char* kindName(int32_t k) { return k == 0 ? "all_reduce" : k == 1 ? "all_gather" : "reduce_scatter"; }
const char* elemName(int32_t e) { return e == 0 ? "f32" : e == 1 ? "f64" : "i64"; }
template <class E>
int32_t elemOf() {
  if constexpr (std::is_same_v<E, float>) return 0;
  else if constexpr (std::is_same_v<E, double>) return 1;
  else return 2;
}

class MpiCommunicator final : public Communicator {
 public:
  MpiCommunicator(Mesh mesh, int64_t rank, std::vector<mpi::Comm> axisComms)
      : mesh_(std::move(mesh)), rank_(rank), coords_(meshCoords(mesh_, rank)), comms_(std::move(axisComms)) {}

  int64_t axisSize(const std::string& axis) const override {
    int a = mesh_.axisIndex(axis);
    return a < 0 ? 1 : mesh_.axes[a].size;
  }
  int64_t axisRank(const std::string& axis) const override {
    int a = mesh_.axisIndex(axis);
    return a < 0 ? 0 : coords_[a];
  }
  int64_t rank() const override { return rank_; }
  void setStep(int64_t step) override { step_ = step; }

  Status allReduce(const std::string& axis, ReduceOp op, float* d, int64_t n) override { return run(axis, 0, op, d, n, d); }
  Status allReduce(const std::string& axis, ReduceOp op, double* d, int64_t n) override { return run(axis, 0, op, d, n, d); }
  Status allReduce(const std::string& axis, ReduceOp op, int64_t* d, int64_t n) override { return run(axis, 0, op, d, n, d); }
  Status allGather(const std::string& axis, const float* in, int64_t n, float* out) override {
    return run(axis, 1, ReduceOp::Sum, in, n, out);
  }
  Status allGather(const std::string& axis, const double* in, int64_t n, double* out) override {
    return run(axis, 1, ReduceOp::Sum, in, n, out);
  }
  Status allGather(const std::string& axis, const int64_t* in, int64_t n, int64_t* out) override {
    return run(axis, 1, ReduceOp::Sum, in, n, out);
  }
  Status reduceScatter(const std::string& axis, ReduceOp op, const float* in, int64_t n, float* out) override {
    return run(axis, 2, op, in, n, out);
  }
  Status reduceScatter(const std::string& axis, ReduceOp op, const double* in, int64_t n, double* out) override {
    return run(axis, 2, op, in, n, out);
  }
  Status reduceScatter(const std::string& axis, ReduceOp op, const int64_t* in, int64_t n, int64_t* out) override {
    return run(axis, 2, op, in, n, out);
  }

 private:
  std::string where(int32_t kind, const std::string& axis) const {
    return cat(rankName(mesh_, rank_), ": ", kindName(kind), " over axis '", axis, "'",
               step_ >= 0 ? cat(" at step ", step_) : std::string());
  }

  // kind 0 all-reduce, 1 all-gather, 2 reduce-scatter (in: size * n elements).
  template <class E>
  Status run(const std::string& axis, int32_t kind, ReduceOp op, const E* in, int64_t n, E* out) {
    int a = mesh_.axisIndex(axis);
    int64_t size = a < 0 ? 1 : mesh_.axes[a].size;
    if (size == 1) {
      if (in != out) std::copy(in, in + n, out);
      return {};
    }
    const mpi::Comm c = comms_[a];
    Header h{kind, elemOf<E>(), op == ReduceOp::Max ? 1 : 0, 0, n};
    std::vector<Header> hs(static_cast<size_t>(size));
    if (Status s = mpi::allGather(c, &h, sizeof h, hs.data()); !s.ok()) return makeError(where(kind, axis), ": ", s.error());
    for (int64_t k = 0; k < size; ++k)
      if (!(hs[k] == h)) {
        std::vector<int64_t> other = coords_;
        other[a] = k;
        return makeError(where(kind, axis), ": the ranks of the group disagree: ", rankName(mesh_, rank_), " runs ",
                         kindName(h.kind), " of ", h.n, " ", elemName(h.elem), ", ", rankName(mesh_, meshRank(mesh_, other)),
                         " runs ", kindName(hs[k].kind), " of ", hs[k].n, " ", elemName(hs[k].elem),
                         " (the per-rank programs do not match)");
      }
    const int64_t each = kind == 2 ? n * size : n;  // elements each rank contributes
    std::vector<E> all(static_cast<size_t>(each * size));
    if (Status s = mpi::allGather(c, in, each * static_cast<int64_t>(sizeof(E)), all.data()); !s.ok())
      return makeError(where(kind, axis), ": ", s.error());
    const int64_t me = coords_[a];
    if (kind == 1) {
      std::copy(all.begin(), all.end(), out);
      return {};
    }
    const int64_t off = kind == 2 ? me * n : 0;
    std::vector<E> result(all.begin() + off, all.begin() + off + n);
    for (int64_t k = 1; k < size; ++k)
      for (int64_t i = 0; i < n; ++i) result[i] = combine(op, result[i], all[k * each + off + i]);
    std::copy(result.begin(), result.end(), out);
    return {};
  }

  Mesh mesh_;
  int64_t rank_;
  std::vector<int64_t> coords_;
  std::vector<mpi::Comm> comms_;  // per mesh axis (unused where the axis has one rank)
  int64_t step_ = -1;
};

}  // namespace

Result<std::shared_ptr<Communicator>> createMpiCommunicator(const Mesh& mesh, const mpi::World& world) {
  if (world.size != mesh.numRanks())
    return makeError("mpirun started ", world.size, " processes, but the run's ", mesh.str(), " has ", mesh.numRanks(),
                     " ranks: start one process per rank (mpirun -np ", mesh.numRanks(), ")");
  std::vector<int64_t> coords = meshCoords(mesh, world.rank);
  std::vector<mpi::Comm> comms(mesh.axes.size());
  // Every process splits along every axis in the same order (MPI_Comm_split is collective over the world).
  for (size_t a = 0; a < mesh.axes.size(); ++a) {
    std::vector<int64_t> base = coords;
    base[a] = 0;
    TPC_ASSIGN(comms[a], mpi::split(world.comm, meshRank(mesh, base), coords[a]));
  }
  return std::shared_ptr<Communicator>(std::make_shared<MpiCommunicator>(mesh, world.rank, std::move(comms)));
}

}  // namespace tpc::cpu
