// How the CPU backend's collectives talk to the other ranks of a mesh. One Communicator per rank; the
// executor only calls it for collective ops. Two implementations: the single-rank one (every axis has one
// rank) and the in-process shared-memory one (a thread per rank, shared_memory_communicator.h).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "ir/mesh.h"
#include "ir/status.h"

namespace tpc::cpu {

enum class ReduceOp { Sum, Max };

// Every collective runs among the ranks that share all mesh coordinates but `axis`'s, ordered by their
// coordinate on `axis`. An axis the communicator does not know has one rank (the identity). Reductions
// combine the ranks' values in rank order, never arrival order, so every rank gets bit-identical results
// and a run repeats bit for bit. Integer and bool values travel as int64_t.
class Communicator {
 public:
  virtual ~Communicator() = default;
  // Number of ranks along a mesh axis that this communicator can reach, and this rank's index on it.
  virtual int64_t axisSize(const std::string& axis) const = 0;
  virtual int64_t axisRank(const std::string& axis) const = 0;
  // This rank's index in the whole mesh (row-major over the mesh axes, the last axis fastest).
  virtual int64_t rank() const { return 0; }
  // The training step being run, for error messages (the executor sets it at the start of a run).
  virtual void setStep(int64_t) {}

  // In place over the ranks of `axis`.
  virtual Status allReduce(const std::string& axis, ReduceOp op, float* data, int64_t n) = 0;
  virtual Status allReduce(const std::string& axis, ReduceOp op, double* data, int64_t n) = 0;
  virtual Status allReduce(const std::string& axis, ReduceOp op, int64_t* data, int64_t n) = 0;
  // out (axisSize * n elements, rank-major) receives every rank's `in` (n elements).
  virtual Status allGather(const std::string& axis, const float* in, int64_t n, float* out) = 0;
  virtual Status allGather(const std::string& axis, const double* in, int64_t n, double* out) = 0;
  virtual Status allGather(const std::string& axis, const int64_t* in, int64_t n, int64_t* out) = 0;
  // in: axisSize * n elements, rank-major chunks; out (n elements) receives the reduction of chunk axisRank.
  virtual Status reduceScatter(const std::string& axis, ReduceOp op, const float* in, int64_t n, float* out) = 0;
  virtual Status reduceScatter(const std::string& axis, ReduceOp op, const double* in, int64_t n, double* out) = 0;
  virtual Status reduceScatter(const std::string& axis, ReduceOp op, const int64_t* in, int64_t n, int64_t* out) = 0;

  // A rank that failed outside a collective calls abort() so that the other ranks, blocked in (or later
  // entering) a collective, return an error instead of waiting forever. The first reason is kept.
  virtual void abort(const std::string& reason) { (void)reason; }
  // Why the group was aborted (the first reason: the root cause), if it was.
  virtual std::optional<std::string> abortReason() const { return std::nullopt; }
  // Clears an abort so the group can run again; only while no rank is inside a collective.
  virtual void reset() {}
};

// How a reduction folds rank k's value into the running result of ranks 0..k-1 (every Communicator folds in
// rank order with this, so that their results agree bit for bit).
template <class E>
inline E combine(ReduceOp op, E acc, E x) {
  if (op == ReduceOp::Sum) return acc + x;
  return (x > acc || x != x) ? x : acc;  // max; a NaN anywhere wins
}

// One rank: every axis has size 1 and every collective is the identity.
std::unique_ptr<Communicator> createSingleRankCommunicator();

// The error for a graph whose mesh axis has more ranks than the communicator reaches.
Error meshMismatch(const std::string& what, const std::string& axis, int64_t want, int64_t have);

}  // namespace tpc::cpu
