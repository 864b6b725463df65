// Evaluation during training (Megatron's --eval-interval / --eval-iters): the mean loss of the model's
// forward graph, dropout off, over a fixed run of validation (or test) batches, with the parameters the
// training backend holds at that moment. Two ways to run it:
// - on the CPU reference executor, the parameters read unsharded through Backend::readState (any training
//   backend and mesh);
// - on a backend of the training's own kind (the CUDA backend on a GPU), prepared once with the forward
//   graph (sharded as the training step is where `tpc run` shards it, on the same ranks), its parameters
//   replaced before each evaluation with Backend::copyStateFrom (device to device, rank by rank, where the
//   training backend holds the same blocks; nothing at all where the device backend reads the training's
//   own buffers, CudaOptions::stateSource).
#pragma once

#include <functional>
#include <memory>
#include <string>

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
  // On `device`, a backend not yet prepared. `passes` (a pipeline, e.g. "mixed-precision(dtype=bf16)"; may
  // be empty) runs after the inference pass, so evaluation computes in the training's precision. It is
  // prepared with zero parameters: each meanLoss takes them from the training backend it is given (nothing to
  // do where `device` reads the training's own buffers, a copy device to device where both are on one GPU), so
  // none are read here. `training` is that backend.
  static Result<std::unique_ptr<Evaluator>> create(const Graph& forward, const std::string& lossOutput,
                                                   std::unique_ptr<Backend> device, const std::string& passes,
                                                   const Backend& training);
  // The same with the backend made for the graph the passes give: `passes` may shard it (a tp policy,
  // data-parallel: tools/compile_pipeline.h's evaluationPipeline), and `makeBackend` then builds a backend
  // over its partitioned rank programs (it may annotate the graph: propagated placements), so that
  // evaluation runs on the training's ranks and each rank copies only its own parameter blocks.
  using BackendFactory = std::function<Result<std::unique_ptr<Backend>>(Graph& evaluated)>;
  static Result<std::unique_ptr<Evaluator>> create(const Graph& forward, const std::string& lossOutput,
                                                   const BackendFactory& makeBackend, const std::string& passes,
                                                   const Backend& training);
  // The mean loss over `iters` batches of `data`, with `state`'s current parameters.
  Result<double> meanLoss(const Backend& state, BatchSource& data, int64_t iters);
  // Where evaluation runs: "cpu executor" or the device backend's name.
  std::string where() const;

 private:
  static Result<std::unique_ptr<Evaluator>> inferenceGraph(const Graph& forward, const std::string& lossOutput,
                                                           const std::string& passes);
  Result<double> deviceMeanLoss(const Backend& state, BatchSource& data, int64_t iters);

  std::unique_ptr<Graph> graph_;
  std::unique_ptr<CpuExecutor> exec_;
  std::unique_ptr<Backend> device_;
  size_t lossIndex_ = 0;
  int64_t calls_ = 0;
};

}  // namespace tpc
