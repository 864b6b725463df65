// The single-rank Communicator: every axis has one rank, so every collective leaves its data as it is.
#include "runtime/cpu/communicator.h"

#include <algorithm>

namespace tpc::cpu {
namespace {

class SingleRankCommunicator final : public Communicator {
 public:
  int64_t axisSize(const std::string&) const override { return 1; }
  int64_t axisRank(const std::string&) const override { return 0; }
  Status allReduce(const std::string&, ReduceOp, float*, int64_t) override { return {}; }
  Status allReduce(const std::string&, ReduceOp, double*, int64_t) override { return {}; }
  Status allReduce(const std::string&, ReduceOp, int64_t*, int64_t) override { return {}; }
  Status allGather(const std::string&, const float* in, int64_t n, float* out) override { return copy(in, n, out); }
  Status allGather(const std::string&, const double* in, int64_t n, double* out) override { return copy(in, n, out); }
  Status allGather(const std::string&, const int64_t* in, int64_t n, int64_t* out) override { return copy(in, n, out); }
  Status reduceScatter(const std::string&, ReduceOp, const float* in, int64_t n, float* out) override {
    return copy(in, n, out);
  }
  Status reduceScatter(const std::string&, ReduceOp, const double* in, int64_t n, double* out) override {
    return copy(in, n, out);
  }
  Status reduceScatter(const std::string&, ReduceOp, const int64_t* in, int64_t n, int64_t* out) override {
    return copy(in, n, out);
  }

 private:
  template <class E>
  static Status copy(const E* in, int64_t n, E* out) {
    std::copy(in, in + n, out);
    return {};
  }
};

}  // namespace

std::unique_ptr<Communicator> createSingleRankCommunicator() { return std::make_unique<SingleRankCommunicator>(); }

Error meshMismatch(const std::string& what, const std::string& axis, int64_t want, int64_t have) {
  if (have == 1)
    return makeError(what, ": mesh axis '", axis, "' has ", want,
                     " ranks, but this executor runs a single rank; run per-rank graphs with the CPU mesh backend "
                     "(createCpuMeshBackend), one graph per rank");
  return makeError(what, ": mesh axis '", axis, "' has ", want, " ranks in the graph but ", have,
                   " in the communicator (was it created for another mesh?)");
}

}  // namespace tpc::cpu
