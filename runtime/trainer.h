// The trainer: the step loop over a Backend, the lr schedule, gradient accumulation (the step graph
// takes [accum, micro_batch, seq] batches), console progress with ETA and a JSONL log that plots.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "ir/graph.h"
#include "runtime/backend.h"
#include "runtime/loss_scale.h"
#include "runtime/lr_schedule.h"

namespace tpc {

// Supplies training windows: `rows` rows of seq+1 tokens each, as tokens (first seq) and targets (last seq).
class BatchSource {
 public:
  virtual ~BatchSource() = default;
  virtual Status next(int32_t* tokens, int32_t* targets, int64_t rows, int64_t seq) = 0;
};

// What the trainer does with a step whose loss or gradient norm is a NaN or an infinity (tpc run --on-nan).
// The backend has left the state unchanged either way (backend.h).
enum class OnNonFinite {
  Stop,  // fail naming the step and the first non-finite value of the step (Backend::findFirstNonFinite)
  Skip,  // drop the step's update, log it as skipped, go on with the next batch
};
Result<OnNonFinite> parseOnNonFinite(const std::string& s);  // "stop" | "skip"

// Where the optimizer stands besides the iteration: what a checkpoint keeps and a resumed run restores.
struct OptimizerProgress {
  int64_t skippedSteps = 0;  // non-finite steps dropped so far: Adam's step is the iteration minus these
  double lossScale = 0;      // the dynamic loss scale (0: no loss scaling)
  int64_t lossScaleGoodSteps = 0;
  int64_t lossScaleHysteresisLeft = -1;  // -1: the settings' hysteresis (a fresh run, an older checkpoint)
};

struct TrainerSettings {
  int64_t trainIters = 100;
  int64_t logInterval = 10;
  LrSchedule lr;
  int64_t firstIter = 1;         // > 1 when resuming
  std::string logJsonl;          // one JSON object per logged step, when set
  bool console = true;           // print a line every log interval
  bool stepLines = true;         // false (--quiet): those lines left out; the JSONL log and metrics keep them
  std::string tokensInput = "tokens", targetsInput = "targets";
  // MFU in the log line when both are set: model FLOPs per trained token (6N + attention) over the peak.
  double flopsPerToken = 0, peakFlops = 0;
  std::string peakName;  // what the peak is, printed with the MFU ("H200 dense fp32 67 TFLOP/s")
  // Every evalInterval steps and after the last (0: never): `evaluate` gives the mean validation loss,
  // printed and logged (valid_loss, valid_ppl) with the step.
  int64_t evalInterval = 0;
  std::function<Result<double>()> evaluate;
  // Receives every step's figures (step, loss, lr, grad_norm; tokens_per_s and elapsed_s when logged;
  // valid_loss after an evaluation): the --metrics-port endpoint.
  std::function<void(const std::map<std::string, double>&)> publish;
  // Called after each step (a skipped one too: its iteration counts), with the iteration just completed, the
  // optimizer's progress after it and how many batch rows the trainer has already read for the next step (it
  // reads the next batch while the backend runs this one; 0 after the last step), which a checkpoint's data
  // position leaves out (checkpoints hang here).
  std::function<Status(int64_t iteration, const OptimizerProgress&, int64_t rowsReadAhead)> afterStep;
  // The iterations at which afterStep prints (a checkpoint's "saved checkpoint" line): the step's own line is
  // written before it there, not after the next step has started, so that the console reads in order.
  std::function<bool(int64_t iteration)> afterStepPrintsAt;
  // Asked after each step before the last, skipped ones too (tpc run --exit-interval, --exit-duration-in-mins,
  // --exit-signal-handler): true ends the run after this step. The step is logged, evaluated where evalInterval says,
  // and afterStep runs for it as for any other, so that a checkpoint can be written there.
  std::function<Result<bool>(int64_t iteration)> stopAfter;
  OnNonFinite onNonFinite = OnNonFinite::Stop;
  // Dynamic loss scaling (fp16), for a step graph with input %loss_scale: a non-finite step is an overflow,
  // skipped whatever onNonFinite says, and halves the scale from the settings' hysteresis-th overflow since it last
  // doubled; the run fails when it would go below the minimum.
  std::optional<LossScaleSettings> lossScaling;
  OptimizerProgress start;  // a resumed run's (from its checkpoint)
};

struct TrainReport {
  std::vector<double> losses;          // the loss of every step that was applied
  std::vector<int64_t> skippedSteps;   // steps dropped as non-finite (OnNonFinite::Skip, or loss-scale overflows)
  OptimizerProgress end;
  double seconds = 0;
  double evalSeconds = 0;       // the part of `seconds` spent in evaluations
  double saveSeconds = 0;       // the part spent in TrainerSettings::afterStep (the caller's checkpoints)
  double tokensPerSecond = 0;   // training tokens over the training's share of `seconds` (neither of the above)
  int64_t lastIteration = 0;    // the last step run: trainIters, or where stopAfter ended the run
};

// Runs settings.trainIters steps of `step` (a training-step graph from buildTrainingStep) on `backend`,
// which must already be prepared with the graph and its initial state. Fails when every step was skipped.
Result<TrainReport> train(Backend& backend, const Graph& step, BatchSource& data, const TrainerSettings& settings,
                          std::ostream& console);

// "1m02s", "3.4s": durations for progress lines.
std::string formatDuration(double seconds);

}  // namespace tpc
