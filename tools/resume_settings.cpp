#include "tools/resume_settings.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <iomanip>

#include "ir/status.h"
#include "runtime/lr_schedule.h"
#include "tools/train_flags.h"

namespace tpc::cli {
namespace {

std::string number(double v) { return cat(std::setprecision(9), v); }

}  // namespace

std::map<std::string, std::string> resumeSettings(const TrainConfig& c) {
  return {{"lr", number(c.lr)},
          {"min-lr", number(c.minLr)},
          {"lr-warmup-iters", std::to_string(c.warmupIters)},
          {"lr-decay-iters", std::to_string(c.decayIters > 0 ? c.decayIters : c.trainIters)},
          {"lr-decay-style", c.decayStyle},
          {"weight-decay", number(c.weightDecay)},
          {"clip-grad", number(c.clipGrad)},
          {"adam-beta1", number(c.beta1)},
          {"adam-beta2", number(c.beta2)},
          {"adam-eps", number(c.eps)},
          {"seq-length", std::to_string(c.seqLength)},
          {"data-path", c.dataPath},
          {"split", c.split},
          {"precision", c.precision}};
}

namespace {
// The settings of the lr schedule (Megatron-LM's OptimizerParamScheduler's), as resumeSettings names them.
constexpr const char* kScheduleFlags[] = {"lr", "min-lr", "lr-warmup-iters", "lr-decay-iters", "lr-decay-style"};
}  // namespace

bool ResumeDifference::ofSchedule() const {
  return std::find(std::begin(kScheduleFlags), std::end(kScheduleFlags), flag) != std::end(kScheduleFlags);
}

std::vector<ResumeDifference> resumeDifferences(const std::map<std::string, std::string>& checkpoint,
                                                const TrainConfig& config, const Flags* flags) {
  std::vector<ResumeDifference> lines;
  for (const auto& [flag, now] : resumeSettings(config)) {
    auto was = checkpoint.find(flag);
    if (was == checkpoint.end() || was->second == now) continue;
    std::string line = "--" + flag + " is " + now;
    if (flag == "lr-decay-iters" || flag == "lr-warmup-iters") {
      // --lr-decay-iters 0 means --train-iters: extending a run stretches its decay.
      const bool ofTrain = flag == "lr-decay-iters" && config.decayIters == 0;
      const std::string source = ofTrain ? "train-iters" : flag;
      // Named as the user gave it: "--lr-decay-samples 4000 is 500 steps", "(--train-samples 48)".
      const std::string by = flags ? stepsFlagGiven(*flags, source) : source;
      if (ofTrain) line += " (--" + (by == source ? source : by + " " + flags->get(by)) + ")";
      else if (by != flag) line = "--" + by + " " + flags->get(by) + " is " + now + " steps";
    }
    line += "; the checkpoint's run had " + was->second;
    if (flag == "lr-decay-iters" || flag == "lr-warmup-iters" || flag == "lr-decay-style")
      line += ": the learning rate schedule changes from this step on";
    else if (flag == "seq-length")
      line += ": the data goes on after the windows trained so far, counted in windows of the new length";
    else if (flag == "data-path" || flag == "split")
      line += ": the data order is another from this step on (the run goes on at the same count of windows in the "
              "new data, not where the checkpoint's run left off)";
    else if (flag == "precision" && was->second == "fp16")
      line += ": the checkpoint's loss scale is not used";
    lines.push_back({flag, line});
  }
  return lines;
}

Status useCheckpointSchedule(const std::map<std::string, std::string>& checkpoint, const std::string& where,
                             TrainConfig& config) {
  for (const char* key : kScheduleFlags)
    if (!checkpoint.count(key))
      return makeError(where, ": error: holds no lr schedule (", key, " is missing: a checkpoint of an older tpc); drop "
                       "--use-checkpoint-opt_param-scheduler and give the schedule by flags");
  // The values as resumeSettings wrote them; anything else is a damaged file.
  bool broken = false;
  auto number = [&](const char* key) {
    const std::string& v = checkpoint.at(key);
    char* end = nullptr;
    errno = 0;
    const double d = std::strtod(v.c_str(), &end);
    broken |= v.empty() || *end != '\0' || errno != 0;
    return d;
  };
  auto steps = [&](const char* key) {
    const double d = number(key);
    broken |= d != std::floor(d) || d < 0 || d > 1e15;
    return static_cast<int64_t>(d);
  };
  TrainConfig c = config;
  c.lr = number("lr");
  c.minLr = number("min-lr");
  c.warmupIters = steps("lr-warmup-iters");
  c.decayIters = steps("lr-decay-iters");
  c.decayStyle = checkpoint.at("lr-decay-style");
  const LrSchedule schedule{c.lr, c.minLr, c.warmupIters, c.decayIters, c.decayStyle};
  if (broken || !schedule.validate().ok() || c.decayIters < 1)
    return makeError(where, ": error: its lr schedule (lr ", checkpoint.at("lr"), ", min-lr ", checkpoint.at("min-lr"),
                     ", warmup ", checkpoint.at("lr-warmup-iters"), ", decay ", checkpoint.at("lr-decay-iters"), ", ",
                     checkpoint.at("lr-decay-style"), ") is not a valid one: the file is damaged");
  config = c;
  return {};
}

}  // namespace tpc::cli
