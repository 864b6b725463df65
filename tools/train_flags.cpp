// Megatron-style training flags.
#include "tools/train_flags.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
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
    {"lr-warmup-iters", &TrainConfig::warmupIters, 0,
     "linear warmup steps (as in Megatron-LM, step N trains at the rate reached after N-1 updates, less skipped steps: "
     "step 1 at 0)"},
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

// Megatron-LM's sample counts (a run of --train-samples, --lr-decay-samples, --lr-warmup-samples instead of the -iters
// flags), each refused together with its iterations flag, as Megatron-LM asserts.
struct SamplesFlag {
  const char* name;
  const char* itersFlag;
  long long lo;
  const char* help;
};
const SamplesFlag kSamplesFlags[] = {
    {"train-samples", "train-iters", 1,
     "as Megatron-LM: --train-iters of samples / global batch (rounded down, as Megatron-LM divides)"},
    {"lr-decay-samples", "lr-decay-iters", 1,
     "as Megatron-LM: --lr-decay-iters of samples / global batch (to the nearest step)"},
    {"lr-warmup-samples", "lr-warmup-iters", 0,
     "as Megatron-LM: --lr-warmup-iters of samples / global batch (to the nearest step)"},
};

// "the global batch of 8 sequences": samples count sequences, and the batch may come from the flags or the model file.
std::string globalBatchWords(const TrainConfig& config) { return cat("the global batch of ", config.globalBatch, " sequences"); }

// The steps a count of samples gives: --train-samples rounds down as Megatron-LM's update_train_iters does; the
// schedule's counts go to the nearest step (Megatron-LM's scheduler counts samples, tpc's whole steps).
int64_t stepsOfSamples(const std::string& flag, long long samples, int64_t globalBatch) {
  if (flag == "train-samples") return samples / globalBatch;
  return std::llround(static_cast<double>(samples) / static_cast<double>(globalBatch));
}

// The decay's length in steps: --lr-decay-iters, or --train-iters when that is 0.
int64_t decaySteps(const TrainConfig& config) { return config.decayIters > 0 ? config.decayIters : config.trainIters; }

}  // namespace

std::string stepsFlagGiven(const Flags& flags, const std::string& itersFlag) {
  for (const SamplesFlag& f : kSamplesFlags)
    if (itersFlag == f.itersFlag && flags.has(f.name)) return f.name;
  if (itersFlag == "lr-warmup-iters" && flags.has("lr-warmup-fraction")) return "lr-warmup-fraction";
  return itersFlag;
}

namespace {

// How the user gave a count of steps, for errors: "--lr-warmup-iters 5", "--lr-warmup-samples 40 (5 steps)".
std::string givenAs(const Flags& flags, const std::string& itersFlag, int64_t steps) {
  const std::string by = stepsFlagGiven(flags, itersFlag);
  if (by == itersFlag) return cat("--", itersFlag, " ", steps);
  return cat("--", by, " ", flags.get(by), " (", steps, " steps)");
}

}  // namespace

void declareTrainingFlags(Flags& flags) {
  for (const IntFlag& f : kIntFlags) flags.value(f.name, f.help);
  for (const FloatFlag& f : kFloatFlags) flags.value(f.name, f.help);
  for (const StringFlag& f : kStringFlags) {
    if (std::string(f.name) == "data-path") flags.words(f.name, f.help);
    else flags.value(f.name, f.help);
  }
  flags.value("lr-warmup-fraction", "as Megatron-LM: the warmup as a fraction of the decay steps (--lr-decay-iters, or "
                                    "--train-iters when that is 0), to the nearest step");
  for (const SamplesFlag& f : kSamplesFlags) flags.value(f.name, f.help);
  flags.value("pipeline-model-parallel-size", "as Megatron-LM, but only 1: tpc has no pipeline parallelism (use --tp/--dp)");
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
  if (flags.has("pipeline-model-parallel-size")) {
    TPC_ASSIGN(long long pp, flags.getInt("pipeline-model-parallel-size", 1, int64_t(1) << 24));
    if (pp != 1) {
      // Megatron-LM's GPUs are tp x pp x dp; tpc's are tp x dp, so the pp ranks go to one of the two.
      const int64_t tp = config.tp, dp = config.dp, gpus = tp * pp * dp;
      return makeError("--pipeline-model-parallel-size ", pp, ": tpc has no pipeline parallelism; spread the same ", gpus,
                       " GPUs (tp ", tp, " x pp ", pp, " x dp ", dp, ") over --tp and --dp instead, with tp x dp = ", gpus,
                       ": e.g. ", tp > 1 ? cat("--tp ", tp, " ") : std::string(), "--dp ", pp * dp, ", or --tp ", tp * pp,
                       dp > 1 ? cat(" --dp ", dp) : std::string());
    }
  }
  if (flags.on("bf16") && flags.on("fp16")) return makeError("--bf16 and --fp16 exclude each other; give one");
  for (const char* alias : {"bf16", "fp16"})
    if (flags.on(alias) && flags.has("precision") && flags.get("precision") != alias)
      return makeError("--", alias, " and --precision ", flags.get("precision"), " exclude each other; give one");
  // Megatron-LM counts a run in samples or in iterations, and its warmup as a fraction or a count: one of each pair.
  for (const SamplesFlag& f : kSamplesFlags)
    if (flags.has(f.name) && flags.has(f.itersFlag))
      return makeError("--", f.name, " and --", f.itersFlag, " exclude each other; give one");
  // Megatron-LM asserts on the values: a warmup of 0 steps or samples given beside the fraction is no conflict.
  for (const char* warmup : {"lr-warmup-iters", "lr-warmup-samples"})
    if (flags.has("lr-warmup-fraction") && flags.has(warmup) && std::strtod(flags.get(warmup).c_str(), nullptr) != 0)
      return makeError("--lr-warmup-fraction and --", warmup, " exclude each other; give one");
  for (const SamplesFlag& f : kSamplesFlags) {
    if (!flags.has(f.name)) continue;
    TPC_ASSIGN(long long samples, flags.getInt(f.name, f.lo, int64_t(1) << 50));
    if (config.globalBatch < 1) break;  // validateTrainConfig names the batch
    const int64_t steps = stepsOfSamples(f.name, samples, config.globalBatch);
    if (steps < f.lo) {
      const bool train = std::string(f.name) == "train-samples";
      return makeError("--", f.name, " ", samples, " is less than ", train ? "" : "half ", globalBatchWords(config),
                       ": no step to ", train ? "train" : "decay over");
    }
    if (std::string(f.itersFlag) == "train-iters") config.trainIters = steps;
    if (std::string(f.itersFlag) == "lr-decay-iters") config.decayIters = steps;
    if (std::string(f.itersFlag) == "lr-warmup-iters") config.warmupIters = steps;
  }
  // Megatron-LM's lr_warmup_steps = lr_warmup_fraction x lr_decay_steps.
  if (flags.has("lr-warmup-fraction")) {
    TPC_ASSIGN(double fraction, flags.getDouble("lr-warmup-fraction"));
    if (!(fraction >= 0 && fraction <= 1))
      return makeError("--lr-warmup-fraction=", flags.get("lr-warmup-fraction"), " must be in [0, 1] (a fraction of the decay steps)");
    config.warmupIters = std::llround(fraction * static_cast<double>(decaySteps(config)));
  }
  const bool warmupGiven = flags.has("lr-warmup-iters") || flags.has("lr-warmup-samples") || flags.has("lr-warmup-fraction");
  const std::string warmup = warmupGiven ? givenAs(flags, "lr-warmup-iters", config.warmupIters)
                                         : cat("the model file's lr_warmup_iters ", config.warmupIters);
  // Megatron-LM asserts the same: warmup inside the decay (an explicit decay length, by a flag or the model file; 0 is
  // --train-iters). A warmup past it would drop the lr from its peak straight to min-lr.
  if (config.decayIters > 0 && config.warmupIters >= config.decayIters)
    return makeError(warmup, " must be less than ",
                     flags.has("lr-decay-iters") || flags.has("lr-decay-samples")
                         ? givenAs(flags, "lr-decay-iters", config.decayIters)
                         : cat("the model file's lr_decay_iters ", config.decayIters));
  // The same when the decay's length is --train-iters: a warmup given on the command line must end inside it (the
  // model file's warmup is left to short trial runs, which warm up only).
  if (warmupGiven && config.decayIters == 0 && config.warmupIters > 0 && config.warmupIters >= config.trainIters)
    return makeError(warmup, " must be less than ", givenAs(flags, "train-iters", config.trainIters),
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
  const std::string warning = cat("tpc ", command, ": warning: ");
  for (const SamplesFlag& f : kSamplesFlags) {
    if (!flags.has(f.name) || config.globalBatch < 1) continue;
    const long long samples = std::strtoll(flags.get(f.name).c_str(), nullptr, 10);
    if (samples % config.globalBatch == 0) continue;
    const int64_t steps = stepsOfSamples(f.name, samples, config.globalBatch);
    if (std::string(f.name) == "train-samples")
      std::cerr << warning << "--train-samples " << samples << " is not a multiple of " << globalBatchWords(config) << ": "
                << steps << " steps (" << steps * config.globalBatch << " samples), as Megatron-LM rounds down\n";
    else
      std::cerr << warning << "--" << f.name << " " << samples << " is not a multiple of " << globalBatchWords(config)
                << ": " << steps << " steps, the nearest (Megatron-LM's schedule counts samples, tpc's whole steps)\n";
  }
  if (flags.has("lr-warmup-fraction")) {
    const double exact = std::strtod(flags.get("lr-warmup-fraction").c_str(), nullptr) * static_cast<double>(decaySteps(config));
    if (std::abs(exact - static_cast<double>(config.warmupIters)) > 1e-6 * std::max(1.0, exact))
      std::cerr << warning << "--lr-warmup-fraction " << flags.get("lr-warmup-fraction") << " of " << decaySteps(config)
                << " decay steps is " << exact << " steps: a warmup of " << config.warmupIters
                << ", the nearest (tpc's schedule counts whole steps)\n";
  }
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
