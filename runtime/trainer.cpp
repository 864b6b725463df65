// The training loop.
#include "runtime/trainer.h"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <sstream>

#include "ir/file_io.h"
#include "ir/json_text.h"

namespace tpc {

std::string formatDuration(double s) {
  char buf[32];
  if (s < 60) std::snprintf(buf, sizeof buf, "%.1fs", s);
  else if (s < 3600) std::snprintf(buf, sizeof buf, "%dm%02ds", static_cast<int>(s) / 60, static_cast<int>(s) % 60);
  else std::snprintf(buf, sizeof buf, "%dh%02dm", static_cast<int>(s) / 3600, (static_cast<int>(s) % 3600) / 60);
  return buf;
}

Result<OnNonFinite> parseOnNonFinite(const std::string& s) {
  if (s == "stop") return OnNonFinite::Stop;
  if (s == "skip") return OnNonFinite::Skip;
  return makeError("--on-nan=", s, " is not a policy (expected stop or skip)");
}

namespace {

const Value* findInput(const Graph& g, const std::string& name) {
  for (const Value* v : g.inputs())
    if (v->name() == name) return v;
  return nullptr;
}

std::string formatRate(double tokensPerSecond) {
  char buf[32];
  if (tokensPerSecond >= 1e6) std::snprintf(buf, sizeof buf, "%.2fM", tokensPerSecond / 1e6);
  else if (tokensPerSecond >= 1e3) std::snprintf(buf, sizeof buf, "%.1fk", tokensPerSecond / 1e3);
  else std::snprintf(buf, sizeof buf, "%.0f", tokensPerSecond);
  return buf;
}

double scalarOf(const HostTensor& t) { return t.numel() == 1 ? t.getAsDouble(0) : NAN; }

// The error for a non-finite step under OnNonFinite::Stop: the step, its loss and norm, and the first
// non-finite value, found by re-running the step (unchanged state, same inputs) in checking mode.
Error nonFiniteStepError(Backend& backend, const TensorMap& inputs, int64_t it, double loss, double gradNorm) {
  std::string first;
  auto found = backend.findFirstNonFinite(inputs, it);
  if (!found.ok()) first = cat("the first non-finite value is unknown: ", found.error());
  else if (!*found) first = "re-run in checking mode, every value of the step was finite (the fault did not repeat)";
  else first = cat("the first non-finite value of the step is ", (*found)->describe());
  return makeError("step ", it, ": the loss is ", loss, " and the gradient norm ", gradNorm, "; ", first,
                   " (diverged: lower --lr, raise --lr-warmup-iters or lower --clip-grad; --on-nan skip drops such "
                   "steps instead)");
}

// Where the time of the timed steps went (the first two steps, which warm the caches and the device up, and
// the evaluations and checkpoints are left out): the trainer's own timing of the batch and the whole step,
// and the backend's (Backend::lastStepTiming) of the device and its host calls. Steps the backend runs but
// does not time on the device (a --profile-step step, TPC_CUDA_DEBUG) are left out of the device figures.
class StepTimes {
 public:
  void add(int64_t it, double wallMs, double batchMs, const std::optional<Backend::StepTiming>& t) {
    all_.add(it, wallMs, batchMs, nullptr);
    if (t && t->deviceMs >= 0) timed_.add(it, wallMs, batchMs, &*t);
  }
  bool empty() const { return all_.steps == 0; }
  // "time per step (steps 3-200): 34.90 ms; the device ran 32.20 ms of it (92.3%); host: ..."
  std::string line() const {
    const Sum& s = timed_.steps > 0 ? timed_ : all_;
    const double n = static_cast<double>(s.steps);
    char buf[480];
    int k = std::snprintf(buf, sizeof buf, "time per step (steps %lld-%lld): %.2f ms", static_cast<long long>(s.first),
                          static_cast<long long>(s.last), s.wall / n);
    if (timed_.steps == 0) {
      std::snprintf(buf + k, sizeof buf - k, "; next batch %.2f", s.batch / n);
      return buf;
    }
    k += std::snprintf(buf + k, sizeof buf - k,
                       "; the device ran %.2f ms of it (%.1f%%); host: inputs and launch %.2f, next batch %.2f (while "
                       "the device runs), waiting %.2f, outputs %.2f, the rest of the loop %.2f",
                       s.device / n, 100 * s.device / s.wall, s.start / n, s.batch / n, s.wait / n, s.read / n,
                       (s.wall - s.start - s.batch - s.wait - s.read) / n);
    if (all_.steps > timed_.steps)
      std::snprintf(buf + k, sizeof buf - k, " (%lld steps not timed on the device left out)",
                    static_cast<long long>(all_.steps - timed_.steps));
    return buf;
  }

 private:
  struct Sum {
    int64_t steps = 0, first = 0, last = 0;
    double wall = 0, batch = 0, start = 0, wait = 0, read = 0, device = 0;
    void add(int64_t it, double wallMs, double batchMs, const Backend::StepTiming* t) {
      if (steps == 0) first = it;
      last = it;
      ++steps;
      wall += wallMs;
      batch += batchMs;
      if (!t) return;
      start += t->startMs;
      wait += t->waitMs;
      read += t->readMs;
      device += t->deviceMs;
    }
  };
  Sum all_, timed_;  // every step after the first two; those the device timed
};

// A resumed run appends to the log of the run it continues. That run may have logged steps past the checkpoint
// before it stopped; they are trained again now, so their lines go (each step is logged once, and a plot never runs
// backwards). Returns how many lines were dropped; a line without a leading "step" is kept.
Result<int64_t> dropLogLinesAfter(const std::string& path, int64_t lastStep) {
  std::ifstream in(path);
  if (!in) return int64_t(0);  // no log yet: the resumed run starts it
  std::string kept, line;
  int64_t dropped = 0;
  while (std::getline(in, line)) {
    const std::string key = "{\"step\": ";
    if (line.rfind(key, 0) == 0 && std::strtoll(line.c_str() + key.size(), nullptr, 10) > lastStep) {
      ++dropped;
      continue;
    }
    kept += line + "\n";
  }
  if (dropped > 0) TPC_TRY(writeFileAtomically(path, kept));
  return dropped;
}

}  // namespace

Result<TrainReport> train(Backend& backend, const Graph& step, BatchSource& data, const TrainerSettings& settings,
                          std::ostream& console) {
  const Value* tokensIn = findInput(step, settings.tokensInput);
  const Value* targetsIn = findInput(step, settings.targetsInput);
  if (!tokensIn || !targetsIn)
    return makeError("the model's graph needs inputs %", settings.tokensInput, " and %", settings.targetsInput);
  if (tokensIn->type() != targetsIn->type() || tokensIn->dtype() != DType::i32 || tokensIn->type().rank() < 2)
    return makeError("inputs %tokens and %targets must both be i32[..., batch, seq], got ", tokensIn->type().str(), " and ",
                     targetsIn->type().str());
  TPC_TRY(settings.lr.validate());
  const int64_t seq = tokensIn->shape().back();
  const int64_t rows = tokensIn->type().numel() / seq;
  const int64_t tokensPerStep = rows * seq;

  std::ofstream jsonl;
  // A fresh log that a failed run wrote no line to is removed again: no empty file left behind.
  struct EmptyLogRemover {
    std::string path;
    bool wroteLine = false, finished = false;
    ~EmptyLogRemover() {
      if (!path.empty() && !wroteLine && !finished) std::remove(path.c_str());
    }
  } emptyLog;
  // A fresh run's log replaces the file's lines only with its first line: a run that fails before it leaves an
  // earlier run's log as it was.
  bool truncateAtFirstLine = false;
  if (!settings.logJsonl.empty()) {
    // A resumed run appends to the log of the run it continues.
    const bool fresh = settings.firstIter <= 1;
    if (!fresh) {
      TPC_ASSIGN(int64_t dropped, dropLogLinesAfter(settings.logJsonl, settings.firstIter - 1));
      if (dropped > 0)
        console << settings.logJsonl << ": dropped " << dropped << " line" << (dropped == 1 ? "" : "s") << " past step "
            << settings.firstIter - 1 << ", the step this run resumes from (they are logged again as it trains them)"
            << std::endl;
    }
    std::error_code ec;
    const bool existed = std::filesystem::exists(settings.logJsonl, ec);
    jsonl.open(settings.logJsonl, std::ios::app);
    if (!jsonl) return makeError(settings.logJsonl, ": error: cannot write the JSONL log");
    if (fresh && !existed) emptyLog.path = settings.logJsonl;
    truncateAtFirstLine = fresh && existed && truncatableFile(settings.logJsonl);
  }
  // One line of the JSONL log, flushed; a write that fails (a full disk) ends the run rather than lose the log.
  auto jsonlLine = [&](const std::string& line) -> Status {
    emptyLog.wroteLine = true;
    if (truncateAtFirstLine) {
      truncateAtFirstLine = false;
      jsonl.close();
      jsonl.open(settings.logJsonl, std::ios::trunc);
    }
    jsonl << line << "\n";
    jsonl.flush();
    if (!jsonl) return makeError(settings.logJsonl, ": error: cannot write the JSONL log (is the disk full?)");
    return {};
  };

  TrainReport report;
  TensorMap inputs;
  // Two batches: the next one is read while the backend runs this one (Backend::startStep/finishStep).
  HostTensor tokens(tokensIn->type()), targets(targetsIn->type());
  HostTensor nextTokens(tokensIn->type()), nextTargets(targetsIn->type());
  using Clock = std::chrono::steady_clock;
  auto msSince = [](Clock::time_point t) { return std::chrono::duration<double, std::milli>(Clock::now() - t).count(); };
  const auto start = Clock::now();
  auto lastLog = start;
  int64_t stepsSinceLog = 0;
  const bool scaling = settings.lossScaling.has_value();
  if (scaling) {
    TPC_TRY(settings.lossScaling->validate());
    if (!findInput(step, "loss_scale"))
      return makeError("loss scaling needs a training step with input %loss_scale (autodiff(loss-scale=true))");
  }
  std::optional<DynamicLossScaler> scaler;
  if (scaling)
    scaler.emplace(*settings.lossScaling, settings.start.lossScale, settings.start.lossScaleGoodSteps,
                   settings.start.lossScaleHysteresisLeft);
  OptimizerProgress progress = settings.start;
  auto currentProgress = [&] {
    if (scaler) {
      progress.lossScale = scaler->scale();
      progress.lossScaleGoodSteps = scaler->goodSteps();
      progress.lossScaleHysteresisLeft = scaler->hysteresisLeft();
    }
    return progress;
  };
  const int64_t total = settings.trainIters - settings.firstIter + 1;
  int64_t lastIter = settings.trainIters;  // earlier when stopAfter ends the run
  StepTimes times;
  // The last logged step's console line, JSONL record and metrics, written by flushLog().
  std::function<Status()> pendingLog;
  auto flushLog = [&]() -> Status {
    if (!pendingLog) return {};
    std::function<Status()> write = std::move(pendingLog);
    pendingLog = nullptr;
    return write();
  };
  // This step's start, its batch time, and what to leave out of its time (evaluations, checkpoints).
  Clock::time_point stepStart{};
  double stepBatchMs = 0, stepAsideMs = 0;
  auto closeStep = [&](int64_t it) {
    if (it >= settings.firstIter + 2) times.add(it, msSince(stepStart) - stepAsideMs, stepBatchMs, backend.lastStepTiming());
  };
  // Every evalInterval steps and after the last, skipped steps too (as Megatron-LM evaluates every iteration).
  auto evaluateAt = [&](int64_t it) -> Status {
    if (!settings.evaluate || settings.evalInterval <= 0 || (it % settings.evalInterval != 0 && it != settings.trainIters))
      return {};
    TPC_TRY(flushLog());  // this step's line before its evaluation
    auto evalStart = Clock::now();
    TPC_ASSIGN(double valid, settings.evaluate());
    if (settings.publish) settings.publish({{"valid_loss", valid}, {"valid_ppl", std::exp(valid)}});
    const auto evalTime = Clock::now() - evalStart;
    lastLog += evalTime;  // tokens/s counts training time only
    report.evalSeconds += std::chrono::duration<double>(evalTime).count();
    stepAsideMs += std::chrono::duration<double, std::milli>(evalTime).count();
    if (settings.console) {
      char line[160];
      std::snprintf(line, sizeof line, "eval at step %lld | valid loss %.4f | valid ppl %.3f",
                    static_cast<long long>(it), valid, std::exp(valid));
      console << line << std::endl;
    }
    if (jsonl.is_open()) {
      std::ostringstream j;
      j << "{\"step\": " << it << ", \"valid_loss\": " << jsonNumber(valid) << ", \"valid_ppl\": " << jsonNumber(std::exp(valid))
        << "}";
      TPC_TRY(jsonlLine(j.str()));
    }
    return {};
  };
  // After each step, skipped ones too: the caller's checkpoint (TrainerSettings::afterStep).
  auto runAfterStep = [&](int64_t it) -> Status {
    if (!settings.afterStep) return {};
    if (settings.afterStepPrintsAt && settings.afterStepPrintsAt(it)) TPC_TRY(flushLog());
    const auto asideStart = Clock::now();
    TPC_TRY(settings.afterStep(it, currentProgress(), it < settings.trainIters ? rows : 0));
    const auto asideTime = Clock::now() - asideStart;
    lastLog += asideTime;  // tokens/s counts training time only, as Megatron-LM's interval timer stops around a save
    report.saveSeconds += std::chrono::duration<double>(asideTime).count();
    stepAsideMs += std::chrono::duration<double, std::milli>(asideTime).count();
    return {};
  };
  if (settings.firstIter <= settings.trainIters)
    TPC_TRY(data.next(nextTokens.data<int32_t>(), nextTargets.data<int32_t>(), rows, seq));
  for (int64_t it = settings.firstIter; it <= settings.trainIters; ++it) {
    if (it > settings.firstIter) closeStep(it - 1);
    stepStart = Clock::now();
    stepAsideMs = 0;
    std::swap(tokens, nextTokens);
    std::swap(targets, nextTargets);
    inputs["tokens"] = tokens;
    inputs["targets"] = targets;
    // Megatron-LM's scheduler: a step trains with the rate of the updates applied before it (with a warmup, step 1's is
    // the warmup's start, 0) and advances only when its update is applied. The rate logged for a step is the one after
    // it, as Megatron-LM logs param_group['lr'] after its scheduler step: step N trained with step N-1's logged rate.
    const double lr = settings.lr.at(it - 1 - progress.skippedSteps);
    const double lossScale = scaler ? scaler->scale() : 0;
    inputs["lr"] = HostTensor::scalarF32(static_cast<float>(lr));
    // Adam's step counts the updates applied: a skipped step does not advance its bias correction.
    inputs["step"] = HostTensor::scalarF32(static_cast<float>(it - progress.skippedSteps));
    if (scaler) inputs["loss_scale"] = HostTensor::scalarF32(static_cast<float>(lossScale));
    Status started = backend.startStep(inputs, it);
    TPC_TRY(flushLog());  // the previous step's line, now that this one is under way
    TPC_TRY(started);
    // The next batch, while the device runs this step; a failure to read it is reported after the step.
    const auto batchStart = Clock::now();
    Status nextBatch = it < settings.trainIters
                           ? data.next(nextTokens.data<int32_t>(), nextTargets.data<int32_t>(), rows, seq)
                           : Status::success();
    stepBatchMs = msSince(batchStart);
    TPC_ASSIGN(TensorMap out, backend.finishStep());
    TPC_TRY(nextBatch);
    auto lossIt = out.find("loss");
    if (lossIt == out.end()) return makeError("the training step has no 'loss' output");
    double loss = scalarOf(lossIt->second);
    double gradNorm = out.count("grad_norm") ? scalarOf(out["grad_norm"]) : NAN;
    const bool nonFinite = isNonFiniteStep(out);
    const double loggedLr = nonFinite ? lr : settings.lr.at(it - progress.skippedSteps);
    if (scaler) {
      Status s = scaler->update(!nonFinite, it);
      if (!s.ok() && settings.onNonFinite == OnNonFinite::Stop) {
        // The scale hit its floor: name the first non-finite value as --on-nan stop does.
        Error e = nonFiniteStepError(backend, inputs, it, loss, gradNorm);
        return makeError(s.error(), "; ", e.message);
      }
      TPC_TRY(s);
    }
    if (nonFinite) {
      if (!scaler && settings.onNonFinite == OnNonFinite::Stop) return nonFiniteStepError(backend, inputs, it, loss, gradNorm);
      report.skippedSteps.push_back(it);
      ++progress.skippedSteps;
      if (settings.console) {
        console << "step " << std::setw(6) << it << "/" << settings.trainIters << " | skipped: loss " << loss
                << ", grad norm " << gradNorm;
        if (scaler)
          console << " (gradient overflow at loss scale " << lossScale << "; "
                  << (scaler->scale() < lossScale ? cat("scale lowered to ", scaler->scale())
                                                  : cat("scale kept, --hysteresis: ", scaler->hysteresisLeft(),
                                                        " more overflow", scaler->hysteresisLeft() == 1 ? "" : "s",
                                                        " before it is halved"))
                  << ", parameters and optimizer state kept)" << std::endl;
        else
          console << " (non-finite; --on-nan skip: parameters and optimizer state kept)" << std::endl;
      }
      if (jsonl.is_open()) {
        std::ostringstream j;
        // The values as the console shows them (a non-finite one as null).
        j << "{\"step\": " << it << ", \"skipped\": true, \"loss\": " << jsonNumber(loss) << ", \"lr\": "
          << std::setprecision(9) << loggedLr << ", \"grad_norm\": " << jsonNumber(gradNorm);
        if (scaler) j << ", \"loss_scale\": " << scaler->scale();
        j << "}";
        TPC_TRY(jsonlLine(j.str()));
      }
      if (settings.publish) settings.publish({{"step", double(it)}});
      if (settings.publish && scaler) settings.publish({{"loss_scale", scaler->scale()}});
      ++stepsSinceLog;
      // A skipped step is still an iteration: a checkpoint or an early stop due here happens here.
      bool stop = false;
      if (settings.stopAfter && it < settings.trainIters) {
        TPC_ASSIGN(stop, settings.stopAfter(it));
      }
      TPC_TRY(evaluateAt(it));
      TPC_TRY(runAfterStep(it));
      if (stop) {
        lastIter = it;
        break;
      }
      continue;
    }
    report.losses.push_back(loss);
    if (settings.publish) settings.publish({{"step", double(it)}, {"loss", loss}, {"lr", loggedLr}, {"grad_norm", gradNorm}});
    if (settings.publish && scaler) settings.publish({{"loss_scale", scaler->scale()}});
    ++stepsSinceLog;
    bool stop = false;
    if (settings.stopAfter && it < settings.trainIters) {
      TPC_ASSIGN(stop, settings.stopAfter(it));
    }
    bool logNow = settings.logInterval > 0 && (it % settings.logInterval == 0 || it == settings.firstIter ||
                                               it == settings.trainIters || stop);
    if (logNow) {
      auto now = Clock::now();
      double elapsed = std::chrono::duration<double>(now - start).count();
      double window = std::chrono::duration<double>(now - lastLog).count();
      double tps = window > 0 ? static_cast<double>(stepsSinceLog * tokensPerStep) / window : 0;
      int64_t done = it - settings.firstIter + 1;
      double eta = elapsed / static_cast<double>(done) * static_cast<double>(total - done);
      lastLog = now;
      stepsSinceLog = 0;
      const std::optional<Backend::StepTiming> timing = backend.lastStepTiming();
      // Written after the next step has started (flushLog): the device does not wait for the console, the JSONL
      // log, the metrics and the memory query. Nothing else prints in between, so the order stays.
      pendingLog = [&, it, loss, loggedLr, gradNorm, tps, elapsed, eta, timing]() -> Status {
        if (settings.publish) settings.publish({{"tokens_per_s", tps}, {"elapsed_s", elapsed}});
        // On the GPU: MFU (of the named peak) and device memory, in the console, the JSONL log and the metrics.
        const double mfu = settings.flopsPerToken > 0 && settings.peakFlops > 0
                               ? tps * settings.flopsPerToken / settings.peakFlops : -1;
        const int64_t deviceMemory = backend.deviceMemoryInUse();
        if (settings.publish && mfu >= 0) settings.publish({{"mfu", mfu}});
        if (settings.publish && deviceMemory >= 0) settings.publish({{"gpu_memory_bytes", double(deviceMemory)}});
        if (settings.console && settings.stepLines) {
          char line[256];
          std::snprintf(line, sizeof line, "step %6lld/%lld | loss %.4f | lr %.3e | grad norm %.3f | %s tok/s | elapsed %s | ETA %s",
                        static_cast<long long>(it), static_cast<long long>(settings.trainIters), loss, loggedLr, gradNorm,
                        formatRate(tps).c_str(), formatDuration(elapsed).c_str(), formatDuration(eta).c_str());
          std::string extra;
          if (mfu >= 0) {
            char m[160];
            std::snprintf(m, sizeof m, " | MFU %.1f%% of %s", 100.0 * mfu, settings.peakName.c_str());
            extra += m;
          }
          if (scaler) {
            char m[64];
            std::snprintf(m, sizeof m, " | loss scale %g", scaler->scale());
            extra += m;
          }
          if (deviceMemory >= 0) {
            char m[64];
            std::snprintf(m, sizeof m, " | GPU mem %.2f GiB", static_cast<double>(deviceMemory) / (1ull << 30));
            extra += m;
          }
          console << line << extra << std::endl;
        }
        if (jsonl.is_open()) {
          std::ostringstream j;
          j << std::setprecision(9) << "{\"step\": " << it << ", \"loss\": " << loss << ", \"lr\": " << loggedLr
            << ", \"grad_norm\": " << (std::isfinite(gradNorm) ? gradNorm : -1.0) << ", \"tokens_per_s\": " << tps
            << ", \"elapsed_s\": " << elapsed;
          if (scaler) j << ", \"loss_scale\": " << scaler->scale();
          if (mfu >= 0) j << ", \"mfu\": " << mfu;
          if (deviceMemory >= 0) j << ", \"gpu_memory_bytes\": " << deviceMemory;
          // The logged step's own time on the device (the CUDA backend's graph replay), to plot against the wall.
          if (timing && timing->deviceMs >= 0) j << ", \"device_ms\": " << timing->deviceMs;
          j << "}";
          TPC_TRY(jsonlLine(j.str()));
        }
        return {};
      };
    }
    TPC_TRY(evaluateAt(it));
    TPC_TRY(runAfterStep(it));
    if (stop) {
      lastIter = it;
      break;
    }
  }
  TPC_TRY(flushLog());
  if (total > 0) closeStep(lastIter);
  if (!times.empty() && settings.console) console << times.line() << std::endl;
  if (report.losses.empty() && lastIter == settings.trainIters)
    return makeError("every one of the ", total, " steps had a non-finite loss or gradient norm and was skipped "
                     "(lower --lr, raise --lr-warmup-iters, or --on-nan stop to find the first non-finite value)");
  report.end = currentProgress();
  report.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  const double trainSeconds = report.seconds - report.evalSeconds - report.saveSeconds;
  const int64_t run = lastIter - settings.firstIter + 1;
  report.tokensPerSecond = trainSeconds > 0 ? static_cast<double>(run * tokensPerStep) / trainSeconds : 0;
  report.lastIteration = lastIter;
  emptyLog.finished = true;
  return report;
}

}  // namespace tpc
