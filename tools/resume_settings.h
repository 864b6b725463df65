// What a resumed `tpc run --load` compares with the checkpoint's run: the lr and its schedule, AdamW's constants,
// the window length, the data (--data-path, --split) and the precision. A resume may change them (a longer run, a lower lr), as Megatron-LM allows
// with --override-opt_param-scheduler; tpc says which changed, and what that does, in one warning line each
// (a note with --override-opt_param-scheduler; --use-checkpoint-opt_param-scheduler keeps the checkpoint's schedule).
#pragma once

#include <map>
#include <string>
#include <vector>

#include "frontend/train_config.h"
#include "tools/cli.h"

namespace tpc::cli {

// Flag name -> value as text (CheckpointState::settings); precision resolved ("bf16", not "auto").
std::map<std::string, std::string> resumeSettings(const TrainConfig& config);

// One line for each setting whose value differs from the checkpoint's (settings missing from an older checkpoint
// are not compared), e.g. "--lr is 0.01; the checkpoint's run had 0.001". With `flags`, a schedule given in
// samples or as a fraction is named by the flag the user gave ("--lr-decay-samples 4000 is 500 steps; ...").
struct ResumeDifference {
  std::string flag;  // "lr", "lr-decay-style", ...
  std::string line;
  bool ofSchedule() const;  // one of the lr schedule's settings (Megatron-LM's OptimizerParamScheduler's)
};
std::vector<ResumeDifference> resumeDifferences(const std::map<std::string, std::string>& checkpoint,
                                                const TrainConfig& config, const Flags* flags = nullptr);

// --use-checkpoint-opt_param-scheduler: `config`'s lr schedule (lr, min-lr, warmup, decay steps and style) set to the
// checkpoint's run's. An error naming `where` when the checkpoint does not hold one (or holds a broken one).
Status useCheckpointSchedule(const std::map<std::string, std::string>& checkpoint, const std::string& where,
                             TrainConfig& config);

}  // namespace tpc::cli
