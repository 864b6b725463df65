// Megatron-style training flags.
#include "tools/train_flags.h"

#include <algorithm>
#include <iostream>
#include <limits>

namespace tpc::cli {
namespace {

struct IntFlag {
  const char* name;
  int64_t TrainConfig::*field;
  long long lo;
  const char* help;
};
struct FloatFlag {
  const char* name;
  double TrainConfig::*field;
  const char* help;
};
struct StringFlag {
  const char* name;
  std::string TrainConfig::*field;
  const char* help;
};

const IntFlag kIntFlags[] = {
    {"micro-batch-size", &TrainConfig::microBatch, 1, "sequences per micro batch (per data-parallel rank)"},
    {"global-batch-size", &TrainConfig::globalBatch, 1, "sequences per optimizer step (micro x accumulation x dp)"},
    {"seq-length", &TrainConfig::seqLength, 1, "tokens per sequence"},
    {"train-iters", &TrainConfig::trainIters, 1, "optimizer steps"},
    {"lr-warmup-iters", &TrainConfig::warmupIters, 0, "linear warmup steps"},
    {"lr-decay-iters", &TrainConfig::decayIters, 0, "steps over which lr decays to --min-lr (0: --train-iters)"},
    {"log-interval", &TrainConfig::logInterval, 1, "steps between log lines"},
    {"tp", &TrainConfig::tp, 1, "tensor-parallel size"},
    {"dp", &TrainConfig::dp, 1, "data-parallel size"},
};
const FloatFlag kFloatFlags[] = {
    {"lr", &TrainConfig::lr, "peak learning rate"},
    {"min-lr", &TrainConfig::minLr, "final learning rate"},
    {"weight-decay", &TrainConfig::weightDecay, "AdamW weight decay (matrices only)"},
    {"clip-grad", &TrainConfig::clipGrad, "global gradient-norm clip (0: off)"},
    {"adam-beta1", &TrainConfig::beta1, "AdamW beta1"},
    {"adam-beta2", &TrainConfig::beta2, "AdamW beta2"},
    {"adam-eps", &TrainConfig::eps, "AdamW epsilon"},
};
const StringFlag kStringFlags[] = {
    {"lr-decay-style", &TrainConfig::decayStyle, "cosine | linear | constant"},
    {"data-path", &TrainConfig::dataPath,
     "indexed dataset prefix (PREFIX.bin + PREFIX.idx), or a blend as in Megatron-LM: weight-prefix pairs "
     "('0.3 web 0.7 books') or prefixes weighed by size ('web books')"},
    {"split", &TrainConfig::split, "train,valid,test weights over documents, e.g. 949,50,1"},
    {"recompute", &TrainConfig::recompute, "activation recomputation: none | selective | full"},
    {"precision", &TrainConfig::precision, "auto | fp32 | bf16 | fp16 (auto: bf16 on the GPU, fp32 on the CPU)"},
};

}  // namespace

void declareTrainingFlags(Flags& flags) {
  for (const IntFlag& f : kIntFlags) flags.value(f.name, f.help);
  for (const FloatFlag& f : kFloatFlags) flags.value(f.name, f.help);
  for (const StringFlag& f : kStringFlags) {
    if (std::string(f.name) == "data-path") flags.words(f.name, f.help);
    else flags.value(f.name, f.help);
  }
  flags.value("seed", "random seed (initialization, data order, dropout)");
  flags.toggle("sp", "sequence parallelism (with --tp)");
  flags.toggle("use-distributed-optimizer", "ZeRO-1: shard the AdamW moments and the update over dp (with --dp)");
  flags.toggle("bf16", "as in Megatron-LM: --precision bf16");
  flags.toggle("fp16", "as in Megatron-LM: --precision fp16");
}

Status applyTrainingFlags(const Flags& flags, TrainConfig& config) {
  bool globalGiven = flags.has("global-batch-size");
  for (const IntFlag& f : kIntFlags) {
    if (!flags.has(f.name)) continue;
    TPC_ASSIGN(long long v, flags.getInt(f.name, f.lo, int64_t(1) << 40));
    config.*f.field = v;
  }
  // Megatron: a micro batch given without a global batch keeps one micro batch per step.
  if (flags.has("micro-batch-size") && !globalGiven) config.globalBatch = config.microBatch * config.dp;
  for (const FloatFlag& f : kFloatFlags) {
    if (!flags.has(f.name)) continue;
    TPC_ASSIGN(double v, flags.getDouble(f.name));
    config.*f.field = v;
  }
  for (const StringFlag& f : kStringFlags)
    if (flags.has(f.name)) config.*f.field = flags.get(f.name);
  if (flags.has("seed")) {
    TPC_ASSIGN(long long s, flags.getInt("seed", 0, std::numeric_limits<long long>::max()));
    config.seed = static_cast<uint64_t>(s);
  }
  if (flags.on("sp")) config.sp = true;
  if (flags.on("use-distributed-optimizer")) config.distributedOptimizer = true;
  if (flags.on("bf16") && flags.on("fp16")) return makeError("--bf16 and --fp16 exclude each other; give one");
  for (const char* alias : {"bf16", "fp16"})
    if (flags.on(alias) && flags.has("precision") && flags.get("precision") != alias)
      return makeError("--", alias, " and --precision ", flags.get("precision"), " exclude each other; give one");
  // Megatron-LM asserts the same: warmup inside the decay (an explicit --lr-decay-iters; 0 is --train-iters).
  if (flags.has("lr-decay-iters") && config.decayIters > 0 && config.warmupIters >= config.decayIters)
    return makeError(flags.has("lr-warmup-iters") ? "--lr-warmup-iters " : "the model file's lr_warmup_iters ", config.warmupIters,
                     " must be less than --lr-decay-iters ", config.decayIters);
  // The same when the decay's length is --train-iters: a warmup given on the command line must end inside it (the
  // model file's warmup is left to short trial runs, which warm up only).
  if (flags.has("lr-warmup-iters") && config.decayIters == 0 && config.warmupIters > 0 &&
      config.warmupIters >= config.trainIters)
    return makeError("--lr-warmup-iters ", config.warmupIters, " must be less than --train-iters ", config.trainIters,
                     " (the lr decays over the steps after the warmup; or give --lr-decay-iters)");
  if (flags.on("bf16")) config.precision = "bf16";
  if (flags.on("fp16")) config.precision = "fp16";
  return {};
}

ConfigFieldName flagOrFieldName(const Flags& flags, const RenamedFlags& renamed) {
  return [&flags, renamed](const std::string& field) {
    if (auto it = renamed.find(field); it != renamed.end())
      return flags.has(it->second) ? "--" + it->second : modelFileFieldName(field);
    std::string flag = field == "tensor_model_parallel_size" ? "tp" : field == "data_parallel_size" ? "dp" : field;
    std::replace(flag.begin(), flag.end(), '_', '-');
    bool declared = false;
    for (const IntFlag& f : kIntFlags) declared |= flag == f.name;
    for (const FloatFlag& f : kFloatFlags) declared |= flag == f.name;
    for (const StringFlag& f : kStringFlags) declared |= flag == f.name;
    if (declared && flags.has(flag)) return "--" + flag;
    if (flag == "precision" && (flags.on("bf16") || flags.on("fp16"))) return std::string(flags.on("bf16") ? "--bf16" : "--fp16");
    return modelFileFieldName(field);
  };
}

void warnIneffectiveFlags(const std::string& command, const Flags& flags, const TrainConfig& config) {
  if (flags.on("sp") && config.tp == 1)
    std::cerr << "tpc " << command << ": warning: --sp does nothing with tp 1 (it splits the sequence over the tp ranks); "
              << "add --tp N\n";
  if (flags.on("use-distributed-optimizer") && config.dp == 1)
    std::cerr << "tpc " << command << ": warning: --use-distributed-optimizer does nothing with dp 1 (it shards the AdamW "
              << "state over the dp ranks); add --dp N\n";
}

Status validateTrainingFlags(const Flags& flags, const TrainConfig& config, const GptConfig* gpt,
                             const RenamedFlags& renamed) {
  const ConfigFieldName name = flagOrFieldName(flags, renamed);
  TPC_TRY(validateTrainConfig(config, name));
  if (gpt) TPC_TRY(validateGpt(*gpt, config, name));
  return {};
}

}  // namespace tpc::cli
