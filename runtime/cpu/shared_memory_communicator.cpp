// The shared-memory Communicator. A collective is two barriers on its group: at the first every rank posts
// a pointer to its input; between them each rank computes its own result from all inputs, combining them
// in rank order (so results are bit-identical on every rank and every run); the second barrier keeps the
// inputs alive until everyone has read them. One mutex and condition variable serve the whole mesh (the
// CPU backend has few ranks); waits have a deadline, and an abort wakes everyone.
#include "runtime/cpu/shared_memory_communicator.h"

#include <algorithm>
#include <condition_variable>
#include <mutex>

namespace tpc::cpu {
namespace {

enum class CollKind : uint8_t { AllReduce, AllGather, ReduceScatter };
enum class Elem : uint8_t { F32, F64, I64 };

const char* collName(CollKind k) {
  switch (k) {
    case CollKind::AllReduce: return "all_reduce";
    case CollKind::AllGather: return "all_gather";
    case CollKind::ReduceScatter: return "reduce_scatter";
  }
  return "?";
}
const char* elemName(Elem e) { return e == Elem::F32 ? "f32" : e == Elem::F64 ? "f64" : "i64"; }
template <class E>
Elem elemOf() {
  if constexpr (std::is_same_v<E, float>) return Elem::F32;
  else if constexpr (std::is_same_v<E, double>) return Elem::F64;
  else return Elem::I64;
}

struct Post {
  CollKind kind = CollKind::AllReduce;
  Elem elem = Elem::F32;
  ReduceOp op = ReduceOp::Sum;
  const void* in = nullptr;
  int64_t n = 0;
  bool operator==(const Post& o) const {
    return kind == o.kind && elem == o.elem && n == o.n && (kind == CollKind::AllGather || op == o.op);
  }
  std::string str() const {
    return cat(collName(kind), kind == CollKind::AllGather ? "" : (op == ReduceOp::Max ? "(max)" : "(sum)"), " of ", n,
               " ", elemName(elem));
  }
};

// The ranks along one axis that share every other coordinate, by their coordinate on the axis.
struct Group {
  std::vector<int64_t> members;
  std::vector<Post> posts;
  std::vector<bool> arrived;
  int64_t count = 0;
  uint64_t generation = 0;
};

struct MeshState {
  Mesh mesh;
  std::chrono::milliseconds timeout;
  std::mutex mu;
  std::condition_variable cv;
  bool aborted = false;
  std::string abortReason;
  // groups[axis][r]: the group whose rank with coordinate 0 on `axis` is r (null for other r).
  std::vector<std::vector<std::unique_ptr<Group>>> groups;

  void abortLocked(const std::string& reason) {
    if (!aborted) {
      aborted = true;
      abortReason = reason;
    }
    cv.notify_all();
  }
};

class SharedMemoryCommunicator final : public Communicator {
 public:
  SharedMemoryCommunicator(std::shared_ptr<MeshState> s, int64_t rank)
      : s_(std::move(s)), rank_(rank), coords_(meshCoords(s_->mesh, rank)) {}

  int64_t axisSize(const std::string& axis) const override { return s_->mesh.axisSize(axis); }
  int64_t axisRank(const std::string& axis) const override {
    int a = s_->mesh.axisIndex(axis);
    return a < 0 ? 0 : coords_[a];
  }
  int64_t rank() const override { return rank_; }
  void setStep(int64_t step) override { step_ = step; }

  Status allReduce(const std::string& axis, ReduceOp op, float* d, int64_t n) override {
    return run(axis, CollKind::AllReduce, op, d, n, d);
  }
  Status allReduce(const std::string& axis, ReduceOp op, double* d, int64_t n) override {
    return run(axis, CollKind::AllReduce, op, d, n, d);
  }
  Status allReduce(const std::string& axis, ReduceOp op, int64_t* d, int64_t n) override {
    return run(axis, CollKind::AllReduce, op, d, n, d);
  }
  Status allGather(const std::string& axis, const float* in, int64_t n, float* out) override {
    return run(axis, CollKind::AllGather, ReduceOp::Sum, in, n, out);
  }
  Status allGather(const std::string& axis, const double* in, int64_t n, double* out) override {
    return run(axis, CollKind::AllGather, ReduceOp::Sum, in, n, out);
  }
  Status allGather(const std::string& axis, const int64_t* in, int64_t n, int64_t* out) override {
    return run(axis, CollKind::AllGather, ReduceOp::Sum, in, n, out);
  }
  Status reduceScatter(const std::string& axis, ReduceOp op, const float* in, int64_t n, float* out) override {
    return run(axis, CollKind::ReduceScatter, op, in, n, out);
  }
  Status reduceScatter(const std::string& axis, ReduceOp op, const double* in, int64_t n, double* out) override {
    return run(axis, CollKind::ReduceScatter, op, in, n, out);
  }
  Status reduceScatter(const std::string& axis, ReduceOp op, const int64_t* in, int64_t n, int64_t* out) override {
    return run(axis, CollKind::ReduceScatter, op, in, n, out);
  }

  void abort(const std::string& reason) override {
    std::lock_guard<std::mutex> lock(s_->mu);
    s_->abortLocked(reason);
  }
  std::optional<std::string> abortReason() const override {
    std::lock_guard<std::mutex> lock(s_->mu);
    if (!s_->aborted) return std::nullopt;
    return s_->abortReason;
  }
  void reset() override {
    std::lock_guard<std::mutex> lock(s_->mu);
    s_->aborted = false;
    s_->abortReason.clear();
    for (auto& axisGroups : s_->groups)
      for (auto& g : axisGroups)
        if (g) {
          g->count = 0;
          std::fill(g->arrived.begin(), g->arrived.end(), false);
          ++g->generation;
        }
  }

 private:
  // "rank 3 (dp=0, tp=3): all_reduce over axis 'tp' at step 7"
  std::string where(CollKind kind, const std::string& axis) const {
    std::string s = cat(rankName(s_->mesh, rank_), ": ", collName(kind), " over axis '", axis, "'");
    if (step_ >= 0) s += cat(" at step ", step_);
    return s;
  }

  // Waits until every member of `g` arrives (posting `post` first, when given). Errors: the mesh was
  // aborted, the members posted different collectives, or the deadline passed (which aborts the mesh).
  Status barrier(Group& g, int64_t me, const Post* post, CollKind kind, const std::string& axis) {
    MeshState& s = *s_;
    std::unique_lock<std::mutex> lock(s.mu);
    if (s.aborted) return makeError(where(kind, axis), " aborted: ", s.abortReason);
    if (post) g.posts[me] = *post;
    g.arrived[me] = true;
    uint64_t gen = g.generation;
    if (++g.count == static_cast<int64_t>(g.members.size())) {
      if (post)
        for (size_t k = 1; k < g.posts.size(); ++k)
          if (!(g.posts[k] == g.posts[0])) {
            std::string msg = cat(where(kind, axis), ": the ranks of the group disagree: ",
                                  rankName(s.mesh, g.members[0]), " runs ", g.posts[0].str(), ", ",
                                  rankName(s.mesh, g.members[k]), " runs ", g.posts[k].str(),
                                  " (the per-rank graphs do not match)");
            s.abortLocked(msg);
            return Error{msg};
          }
      g.count = 0;
      std::fill(g.arrived.begin(), g.arrived.end(), false);
      ++g.generation;
      s.cv.notify_all();
      return {};
    }
    auto deadline = std::chrono::steady_clock::now() + s.timeout;
    s.cv.wait_until(lock, deadline, [&] { return g.generation != gen || s.aborted; });
    if (g.generation != gen) return {};
    if (s.aborted) return makeError(where(kind, axis), " aborted: ", s.abortReason);
    std::string missing;
    for (size_t k = 0; k < g.members.size(); ++k)
      if (!g.arrived[k]) missing += cat(missing.empty() ? "" : ", ", g.members[k]);
    std::string msg = cat(where(kind, axis), " did not complete within ",
                          std::chrono::duration<double>(s.timeout).count(), " s: rank(s) ", missing,
                          " of the group never arrived (a rank is stuck, failed, or runs a different program)");
    s.abortLocked(msg);
    return Error{msg};
  }

  template <class E>
  Status run(const std::string& axis, CollKind kind, ReduceOp op, const E* in, int64_t n, E* out) {
    int a = s_->mesh.axisIndex(axis);
    int64_t size = a < 0 ? 1 : s_->mesh.axes[a].size;
    if (size == 1) {
      if (in != out) std::copy(in, in + n, out);
      return {};
    }
    std::vector<int64_t> base = coords_;
    base[a] = 0;
    Group& g = *s_->groups[a][meshRank(s_->mesh, base)];
    int64_t me = coords_[a];
    Post post{kind, elemOf<E>(), op, in, n};
    TPC_TRY(barrier(g, me, &post, kind, axis));
    // Every input stays valid until the second barrier; results go to a private buffer first because
    // all_reduce works in place and the others still read our input.
    std::vector<const E*> ins(static_cast<size_t>(size));
    for (int64_t k = 0; k < size; ++k) ins[k] = static_cast<const E*>(g.posts[k].in);
    std::vector<E> result;
    switch (kind) {
      case CollKind::AllReduce:
      case CollKind::ReduceScatter: {
        int64_t off = kind == CollKind::ReduceScatter ? me * n : 0;
        result.assign(ins[0] + off, ins[0] + off + n);
        for (int64_t k = 1; k < size; ++k)
          for (int64_t i = 0; i < n; ++i) result[i] = combine(op, result[i], ins[k][off + i]);
        break;
      }
      case CollKind::AllGather:
        result.resize(static_cast<size_t>(n * size));
        for (int64_t k = 0; k < size; ++k) std::copy(ins[k], ins[k] + n, result.begin() + k * n);
        break;
    }
    TPC_TRY(barrier(g, me, nullptr, kind, axis));
    std::copy(result.begin(), result.end(), out);
    return {};
  }

  std::shared_ptr<MeshState> s_;
  int64_t rank_;
  std::vector<int64_t> coords_;
  int64_t step_ = -1;
};

}  // namespace

std::vector<int64_t> meshCoords(const Mesh& mesh, int64_t rank) {
  std::vector<int64_t> c(mesh.axes.size());
  for (size_t k = mesh.axes.size(); k-- > 0;) {
    c[k] = rank % mesh.axes[k].size;
    rank /= mesh.axes[k].size;
  }
  return c;
}

int64_t meshRank(const Mesh& mesh, const std::vector<int64_t>& coords) {
  int64_t r = 0;
  for (size_t k = 0; k < mesh.axes.size(); ++k) r = r * mesh.axes[k].size + coords[k];
  return r;
}

std::string rankName(const Mesh& mesh, int64_t rank) {
  if (mesh.axes.empty()) return cat("rank ", rank);
  std::vector<int64_t> c = meshCoords(mesh, rank);
  std::string s = cat("rank ", rank, " (");
  for (size_t k = 0; k < c.size(); ++k) s += cat(k ? ", " : "", mesh.axes[k].name, "=", c[k]);
  return s + ")";
}

std::vector<std::shared_ptr<Communicator>> createMeshCommunicators(const Mesh& mesh, std::chrono::milliseconds timeout) {
  auto s = std::make_shared<MeshState>();
  s->mesh = mesh;
  s->timeout = timeout;
  int64_t ranks = mesh.numRanks();
  s->groups.resize(mesh.axes.size());
  for (size_t a = 0; a < mesh.axes.size(); ++a) {
    s->groups[a].resize(static_cast<size_t>(ranks));
    for (int64_t r = 0; r < ranks; ++r) {
      std::vector<int64_t> c = meshCoords(mesh, r);
      if (c[a] != 0) continue;
      auto g = std::make_unique<Group>();
      for (int64_t k = 0; k < mesh.axes[a].size; ++k) {
        c[a] = k;
        g->members.push_back(meshRank(mesh, c));
      }
      g->posts.resize(g->members.size());
      g->arrived.assign(g->members.size(), false);
      s->groups[a][r] = std::move(g);
    }
  }
  std::vector<std::shared_ptr<Communicator>> comms;
  for (int64_t r = 0; r < ranks; ++r) comms.push_back(std::make_shared<SharedMemoryCommunicator>(s, r));
  return comms;
}

}  // namespace tpc::cpu
