// The trainer: the step loop over a Backend, the lr schedule, gradient accumulation (the step graph
// takes [accum, micro_batch, seq] batches), console progress with ETA and a JSONL log that plots.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <ostream>
#include <string>
#include <vector>

#include "ir/graph.h"
#include "runtime/backend.h"
#include "runtime/lr_schedule.h"

namespace tpc {

// Supplies training windows: `rows` rows of seq+1 tokens each, as tokens (first seq) and targets (last seq).
class BatchSource {
 public:
  virtual ~BatchSource() = default;
  virtual Status next(int32_t* tokens, int32_t* targets, int64_t rows, int64_t seq) = 0;
};

struct TrainerSettings {
  int64_t trainIters = 100;
  int64_t logInterval = 10;
  LrSchedule lr;
  int64_t firstIter = 1;         // > 1 when resuming
  std::string logJsonl;          // one JSON object per logged step, when set
  bool console = true;           // print a line every log interval
  std::string tokensInput = "tokens", targetsInput = "targets";
  // Every evalInterval steps and after the last (0: never): `evaluate` gives the mean validation loss,
  // printed and logged (valid_loss, valid_ppl) with the step.
  int64_t evalInterval = 0;
  std::function<Result<double>()> evaluate;
  // Receives every step's figures (step, loss, lr, grad_norm; tokens_per_s and elapsed_s when logged;
  // valid_loss after an evaluation): the --metrics-port endpoint.
  std::function<void(const std::map<std::string, double>&)> publish;
  // Called after each step's update, with the iteration just completed (checkpoints hang here).
  std::function<Status(int64_t iteration)> afterStep;
};

struct TrainReport {
  std::vector<double> losses;  // every step's loss
  double seconds = 0;
  double tokensPerSecond = 0;
};

// Runs settings.trainIters steps of `step` (a training-step graph from buildTrainingStep) on `backend`,
// which must already be prepared with the graph and its initial state.
Result<TrainReport> train(Backend& backend, const Graph& step, BatchSource& data, const TrainerSettings& settings,
                          std::ostream& console);

// "1m02s", "3.4s": durations for progress lines.
std::string formatDuration(double seconds);

}  // namespace tpc
