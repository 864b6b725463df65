// Megatron-style training flags shared by the sub-commands that train (`tpc run`): declared once, applied
// as overrides of a model file's TrainConfig.
#pragma once

#include "frontend/train_config.h"
#include "tools/cli.h"

namespace tpc::cli {

// Declares --micro-batch-size, --global-batch-size, --seq-length, --train-iters, --lr, --min-lr,
// --lr-warmup-iters, --lr-decay-iters, --lr-decay-style, --weight-decay, --clip-grad, --adam-beta1/2,
// --adam-eps, --log-interval, --seed, --data-path, --split, --tp, --dp, --sp.
void declareTrainingFlags(Flags& flags);
// Applies the flags that were given; an unparsable or out-of-range value is an error naming the flag.
Status applyTrainingFlags(const Flags& flags, TrainConfig& config);

}  // namespace tpc::cli
