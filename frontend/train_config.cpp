// Validation of the training configuration; field names in errors are the model file's (model.fbs).
#include "frontend/train_config.h"

#include <cmath>

#include "frontend/token_windows.h"
#include "ir/attr.h"

namespace tpc {
namespace {

bool oneOf(const std::string& v, std::initializer_list<const char*> allowed) {
  for (const char* a : allowed)
    if (v == a) return true;
  return false;
}

// "949,50,1" as Megatron-LM reads it (splitDocuments): up to three non-negative numbers, not all zero.
Status checkSplit(const std::string& s, const std::string& field) {
  if (auto parsed = parseSplitWeights(s); !parsed) return makeError(field, "='", s, "' ", parsed.error());
  return {};
}

}  // namespace

std::string modelFileFieldName(const std::string& field) {
  return field.rfind("arch.", 0) == 0 ? field : "config." + field;
}

Status validateTrainConfig(const TrainConfig& c, const ConfigFieldName& name) {
  auto positive = [&](const char* f, int64_t v) -> Status {
    if (v <= 0) return makeError(name(f), " must be > 0, got ", v);
    return {};
  };
  auto nonNegative = [&](const char* f, int64_t v) -> Status {
    if (v < 0) return makeError(name(f), " must be >= 0, got ", v);
    return {};
  };
  auto finiteAtLeast = [&](const char* f, double v, double lo, bool strict) -> Status {
    if (!std::isfinite(v) || v < lo || (strict && v == lo))
      return makeError(name(f), " must be ", std::isfinite(v) ? "" : "a finite number ", strict ? "> " : ">= ",
                       formatFloat(lo), ", got ", formatFloat(v));
    return {};
  };
  if (c.optimizer != "adamw") return makeError(name("optimizer"), " must be adamw, got '", c.optimizer, "'");
  for (auto [f, v] : {std::pair{"adam_beta1", c.beta1}, std::pair{"adam_beta2", c.beta2}})
    if (!(v >= 0 && v < 1)) return makeError(name(f), " must be in [0, 1), got ", formatFloat(v));
  TPC_TRY(finiteAtLeast("adam_eps", c.eps, 0, true));
  TPC_TRY(finiteAtLeast("weight_decay", c.weightDecay, 0, false));
  TPC_TRY(finiteAtLeast("clip_grad", c.clipGrad, 0, false));
  TPC_TRY(finiteAtLeast("lr", c.lr, 0, true));  // the schedule needs a peak (LrSchedule::validate)
  TPC_TRY(finiteAtLeast("min_lr", c.minLr, 0, false));
  if (c.minLr > c.lr) return makeError(name("min_lr"), "=", formatFloat(c.minLr), " must be <= ", name("lr"), "=", formatFloat(c.lr));
  TPC_TRY(nonNegative("lr_warmup_iters", c.warmupIters));
  if (!oneOf(c.decayStyle, {"cosine", "linear", "constant"}))
    return makeError(name("lr_decay_style"), " must be cosine, linear or constant, got '", c.decayStyle, "'");
  TPC_TRY(nonNegative("lr_decay_iters", c.decayIters));
  TPC_TRY(positive("micro_batch_size", c.microBatch));
  TPC_TRY(positive("global_batch_size", c.globalBatch));
  TPC_TRY(positive("seq_length", c.seqLength));
  TPC_TRY(positive("train_iters", c.trainIters));
  TPC_TRY(positive("tensor_model_parallel_size", c.tp));
  TPC_TRY(positive("data_parallel_size", c.dp));
  // Bounds that keep every size computed from them far from int64 overflow.
  constexpr int64_t kMax = int64_t(1) << 24;
  for (auto [f, v] : {std::pair{"micro_batch_size", c.microBatch}, std::pair{"seq_length", c.seqLength},
                      std::pair{"tensor_model_parallel_size", c.tp}, std::pair{"data_parallel_size", c.dp}})
    if (v > kMax) return makeError(name(f), "=", v, " is larger than the supported ", kMax);
  if (const int64_t unit = c.microBatch * c.dp; c.globalBatch % unit != 0) {
    const int64_t below = c.globalBatch / unit * unit;
    return makeError(name("global_batch_size"), "=", c.globalBatch, " must be a multiple of ", name("micro_batch_size"),
                     c.dp == 1 ? cat("=", c.microBatch) : cat(" x ", name("data_parallel_size"), " = ", c.microBatch, " x ", c.dp, " = ", unit),
                     " (a step is whole micro batches on every data-parallel rank), e.g. ",
                     below > 0 ? cat(below, " or ", below + unit) : cat(unit));
  }
  TPC_TRY(checkSplit(c.split, name("split")));
  if (!oneOf(c.tokenizer, {"gpt2", "byte"})) return makeError(name("tokenizer_type"), " must be gpt2 or byte, got '", c.tokenizer, "'");
  TPC_TRY(positive("log_interval", c.logInterval));  // as --log-interval (0 would log nothing)
  TPC_TRY(nonNegative("eval_interval", c.evalInterval));
  TPC_TRY(nonNegative("eval_iters", c.evalIters));
  TPC_TRY(nonNegative("save_interval", c.saveInterval));
  if (!oneOf(c.recompute, {"none", "selective", "full"}))
    return makeError(name("recompute"), " must be none, selective or full, got '", c.recompute, "'");
  if (!oneOf(c.precision, {"auto", "fp32", "bf16", "fp16"}))
    return makeError(name("precision"), " must be auto, fp32, bf16 or fp16, got '", c.precision, "'");
  return {};
}

}  // namespace tpc
