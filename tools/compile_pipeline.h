// The compile pipeline that turns a model file's forward graph into the per-step program, shared by
// `tpc run` (which executes its result) and `tpc dump` (which prints it after any stage).
#pragma once

#include <optional>
#include <string>

#include "frontend/model_file.h"
#include "ir/status.h"

namespace tpc {

// Gradient-accumulation steps for the config (global / (micro x dp)), or an error naming the flags.
Result<int64_t> accumulationSteps(const TrainConfig& config);
// Rebuilds a GPT model's forward graph when the config's micro batch or sequence length differs from
// the graph's inputs; other model files must already match.
Status matchBatchShape(ModelFile& model, const std::string& path);
// The pass pipeline, e.g. "autodiff(accum=1, clip-grad=1.0, ...),cse,dce". With --tp/--dp/--sp the sharding
// policies join it ("megatron-tp(tp=4),sequence-parallel,autodiff(...),cse,dce,data-parallel(dp=2)") and,
// given `partitionRank`, the engine's `partition(rank=R)` ends it. `tpPolicy` is the pass that annotates the
// tp placements (a built-in or a plugin's; it gets the option tp=N).
std::string standardPipeline(const ModelFile& model, int64_t accum, std::optional<int64_t> partitionRank = std::nullopt,
                             const std::string& tpPolicy = "megatron-tp");

// The passes that make evaluation's graph (the forward graph after the inference pass) compute as the
// training step does: the tp policy and sequence parallelism, bf16 under `precision` "bf16" (fp16 and fp32
// runs evaluate in fp32), and data-parallel, so that with --tp/--dp/--sp it is sharded over the training's
// mesh with the same placement of every parameter (the evaluator then reads or copies each rank's parameter
// blocks in the training backend's memory), and fold-vocab-padding, as the training step has.
std::string evaluationPipeline(const ModelFile& model, const std::string& precision,
                               const std::string& tpPolicy = "megatron-tp");

}  // namespace tpc
