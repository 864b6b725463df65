// How the CPU backend's collectives talk to the other ranks of a mesh. One Communicator per rank; the
// executor only calls it for collective ops. Today only the single-rank implementation exists; an
// in-process shared-memory one (a thread per rank) plugs in here with the sharding work.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "ir/mesh.h"
#include "ir/status.h"

namespace tpc::cpu {

enum class ReduceOp { Sum, Max };

class Communicator {
 public:
  virtual ~Communicator() = default;
  // Number of ranks along a mesh axis that this communicator can reach, and this rank's index on it.
  virtual int64_t axisSize(const std::string& axis) const = 0;
  virtual int64_t axisRank(const std::string& axis) const = 0;
  // In place over the ranks of `axis`.
  virtual Status allReduce(const std::string& axis, ReduceOp op, float* data, int64_t n) = 0;
  virtual Status allReduce(const std::string& axis, ReduceOp op, double* data, int64_t n) = 0;
  // out (axisSize * n elements, rank-major) receives every rank's `in` (n elements).
  virtual Status allGather(const std::string& axis, const float* in, int64_t n, float* out) = 0;
  virtual Status allGather(const std::string& axis, const double* in, int64_t n, double* out) = 0;
};

// One rank: every axis has size 1 and every collective is the identity.
std::unique_ptr<Communicator> createSingleRankCommunicator();

// The error for a graph whose mesh needs more ranks than the communicator has.
Error multiRankUnsupported(const std::string& what, const std::string& axis, int64_t size);

}  // namespace tpc::cpu
