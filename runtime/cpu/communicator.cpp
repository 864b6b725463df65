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
  Status allGather(const std::string&, const float* in, int64_t n, float* out) override {
    std::copy(in, in + n, out);
    return {};
  }
  Status allGather(const std::string&, const double* in, int64_t n, double* out) override {
    std::copy(in, in + n, out);
    return {};
  }
};

}  // namespace

std::unique_ptr<Communicator> createSingleRankCommunicator() { return std::make_unique<SingleRankCommunicator>(); }

Error multiRankUnsupported(const std::string& what, const std::string& axis, int64_t size) {
  return makeError(what, ": mesh axis '", axis, "' has ", size,
                   " ranks, but the CPU backend runs a single rank for now (multi-rank CPU execution lands with the "
                   "sharding issue); run with a mesh of size 1 along '", axis, "'");
}

}  // namespace tpc::cpu
