// The standard compile pipeline.
#include "tools/compile_pipeline.h"

#include "ir/attr.h"
#include "models/gpt.h"

namespace tpc {

Result<int64_t> accumulationSteps(const TrainConfig& c) {
  if (c.globalBatch % (c.microBatch * c.dp) != 0)
    return makeError("--global-batch-size=", c.globalBatch, " is not a multiple of --micro-batch-size=", c.microBatch,
                     " x --dp=", c.dp);
  return c.globalBatch / (c.microBatch * c.dp);
}

Status matchBatchShape(ModelFile& model, const std::string& path) {
  const TrainConfig& c = model.config;
  const Value* tokens = nullptr;
  for (const Value* v : model.forward->inputs())
    if (v->name() == "tokens") tokens = v;
  if (tokens && tokens->type().rank() == 2 && tokens->shape()[0] == c.microBatch && tokens->shape()[1] == c.seqLength)
    return {};
  if (!model.gpt)
    return makeError(path, ": error: the graph's %tokens is ", tokens ? tokens->type().str() : "missing",
                     " but the run asks for [", c.microBatch, ",", c.seqLength,
                     "]; this model file has no architecture record to rebuild it from");
  TPC_ASSIGN(ModelFile rebuilt, buildGpt(*model.gpt, c));
  model.forward = std::move(rebuilt.forward);
  return {};
}

std::string standardPipeline(const ModelFile& model, int64_t accum) {
  const TrainConfig& c = model.config;
  return cat("autodiff(loss=", model.lossOutput, ", accum=", accum, ", clip-grad=", formatFloat(c.clipGrad),
             ", beta1=", formatFloat(c.beta1), ", beta2=", formatFloat(c.beta2), ", eps=", formatFloat(c.eps),
             ", weight-decay=", formatFloat(c.weightDecay), "),cse,dce");
}

}  // namespace tpc
