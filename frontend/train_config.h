// The training configuration a model file carries (Megatron-style names); `tpc run` flags override it.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "ir/status.h"

namespace tpc {

struct TrainConfig {
  // Optimizer: AdamW with decoupled weight decay on matrices only, global-norm gradient clipping.
  std::string optimizer = "adamw";
  double beta1 = 0.9, beta2 = 0.95, eps = 1e-8;
  double weightDecay = 0.1;
  double clipGrad = 1.0;  // 0 disables clipping
  // Learning rate: linear warmup, then decay to minLr over decayIters (0: trainIters).
  double lr = 6e-4, minLr = 6e-5;
  int64_t warmupIters = 0;
  std::string decayStyle = "cosine";  // cosine | linear | constant
  int64_t decayIters = 0;
  // Batch: global = micro x accumulation steps x dp.
  int64_t microBatch = 8, globalBatch = 8, seqLength = 1024;
  int64_t trainIters = 100;
  // Data: a Megatron indexed dataset prefix, the train/valid/test split, the tokenizer it was made with.
  std::string dataPath;
  std::string split = "949,50,1";
  std::string tokenizer = "gpt2";  // gpt2 | byte
  // Parallelism defaults.
  int64_t tp = 1, dp = 1;
  bool sp = false;
  bool distributedOptimizer = false;  // Megatron's --use-distributed-optimizer: ZeRO-1 over dp
  // Intervals (0: never).
  int64_t logInterval = 10, evalInterval = 0, evalIters = 10, saveInterval = 0;
  uint64_t seed = 1234;
  std::string precision = "auto";  // auto | fp32 | bf16 | fp16
  std::string recompute = "none";  // none | selective | full (activation recomputation)

  bool operator==(const TrainConfig&) const = default;
};

// How a validation error names a field of the config: the model file's `config.micro_batch_size` by default;
// the CLI names the flag that set it instead (`--micro-batch-size`, cli::validateTrainingFlags). `field` is a
// TrainConfig field ("micro_batch_size") or, from validateGpt, an arch one with its block ("arch.heads").
using ConfigFieldName = std::function<std::string(const std::string& field)>;
std::string modelFileFieldName(const std::string& field);  // "config." + field; "arch.*" as it is

// Checks every field; errors name each field through `name` (`config.micro_batch_size must be > 0, got 0`).
Status validateTrainConfig(const TrainConfig& c, const ConfigFieldName& name = modelFileFieldName);

}  // namespace tpc
