// Evaluation during training (Megatron's --eval-interval / --eval-iters): the mean loss of the model's
// forward graph, dropout off, over a fixed run of validation (or test) batches, with the parameters the
// training backend holds at that moment. Runs on the CPU reference executor with the parameters read
// unsharded through Backend::readState, so it works under every backend and mesh.
#pragma once

#include <memory>

#include "ir/graph.h"
#include "runtime/backend.h"
#include "runtime/cpu/cpu_executor.h"
#include "runtime/trainer.h"

namespace tpc {

class Evaluator {
 public:
  // `forward`: the unsharded forward graph (inputs tokens and targets [B, T], a scalar loss output named
  // `lossOutput`); the inference pass is applied to a copy.
  static Result<std::unique_ptr<Evaluator>> create(const Graph& forward, const std::string& lossOutput,
                                                   CpuOptions options);
  // The mean loss over `iters` batches of `data`, with `state`'s current parameters.
  Result<double> meanLoss(const Backend& state, BatchSource& data, int64_t iters);

 private:
  std::unique_ptr<Graph> graph_;
  std::unique_ptr<CpuExecutor> exec_;
  size_t lossIndex_ = 0;
};

}  // namespace tpc
