#include "tools/resume_settings.h"

#include <iomanip>

#include "ir/status.h"

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
          {"precision", c.precision}};
}

std::vector<std::string> resumeDifferences(const std::map<std::string, std::string>& checkpoint,
                                           const TrainConfig& config) {
  std::vector<std::string> lines;
  for (const auto& [flag, now] : resumeSettings(config)) {
    auto was = checkpoint.find(flag);
    if (was == checkpoint.end() || was->second == now) continue;
    std::string line = "--" + flag + " is " + now;
    // --lr-decay-iters 0 means --train-iters: extending a run stretches its decay.
    if (flag == "lr-decay-iters" && config.decayIters == 0) line += " (--train-iters)";
    line += "; the checkpoint's run had " + was->second;
    if (flag == "lr-decay-iters" || flag == "lr-warmup-iters" || flag == "lr-decay-style")
      line += ": the learning rate schedule changes from this step on";
    else if (flag == "seq-length")
      line += ": the data goes on after the windows trained so far, counted in windows of the new length";
    else if (flag == "precision" && was->second == "fp16")
      line += ": the checkpoint's loss scale is not used";
    lines.push_back(line);
  }
  return lines;
}

}  // namespace tpc::cli
