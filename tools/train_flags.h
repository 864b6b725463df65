// Megatron-style training flags shared by the sub-commands that train (`tpc run`): declared once, applied
// as overrides of a model file's TrainConfig.
#pragma once

#include <map>
#include <string>

#include "frontend/architecture.h"
#include "frontend/train_config.h"
#include "tools/cli.h"

namespace tpc::cli {

// Declares --micro-batch-size, --global-batch-size, --seq-length, --train-iters, --lr, --min-lr,
// --lr-warmup-iters, --lr-decay-iters, --lr-decay-style, --weight-decay, --clip-grad, --adam-beta1/2,
// --adam-eps, --log-interval, --seed, --data-path, --split, --tp, --dp, --sp; and Megatron-LM's other ways to give
// the schedule (--lr-warmup-fraction, --train-samples, --lr-decay-samples, --lr-warmup-samples) and
// --pipeline-model-parallel-size 1.
void declareTrainingFlags(Flags& flags);
// The flag that gave a count of steps (train-iters, lr-decay-iters or lr-warmup-iters), as the user chose it:
// "lr-warmup-samples", "lr-warmup-fraction", "train-samples", ..., or `itersFlag` itself.
std::string stepsFlagGiven(const Flags& flags, const std::string& itersFlag);
// Applies the flags that were given; an unparsable or out-of-range value is an error naming the flag.
Status applyTrainingFlags(const Flags& flags, TrainConfig& config);
// Names a config field as the user set it: the flag where one was given (`--seq-length`), else the model
// file's field (`config.seq_length`). `renamed`: a command's own flag for a field, where it has one of another
// name than the training flag's or one for an arch field (tpc new: {"seq_length", "seq"}, {"arch.heads", "heads"}).
using RenamedFlags = std::map<std::string, std::string>;
ConfigFieldName flagOrFieldName(const Flags& flags, const RenamedFlags& renamed = {});
// One warning line on stderr for each flag given that does nothing in this config: --sp with tp 1,
// --use-distributed-optimizer with dp 1 (accepted, as Megatron-LM does, so that one command line serves a sweep);
// and for each count of samples or warmup fraction that is not a whole number of steps (saying the steps taken).
void warnIneffectiveFlags(const std::string& command, const Flags& flags, const TrainConfig& config);
// validateTrainConfig, and validateGpt where the model has an arch block, with errors naming the flags given.
Status validateTrainingFlags(const Flags& flags, const TrainConfig& config, const GptConfig* gpt,
                             const RenamedFlags& renamed = {});

}  // namespace tpc::cli
