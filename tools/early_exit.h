// Megatron-LM's ways to end a training run early, after a step and with a checkpoint where --save is given:
// --exit-interval N (after every step divisible by N), --exit-duration-in-mins M (once the run has taken M minutes,
// for a job's time limit) and --exit-signal-handler (on SIGTERM, which schedulers send before they kill a job, or
// SIGINT: Ctrl-C). A resumed run goes on from the checkpoint.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

#include "ir/status.h"
#include "tools/cli.h"

namespace tpc::cli {

enum class ExitReason : uint8_t { None = 0, Interval = 1, Duration = 2, Signal = 3 };

class EarlyExit {
 public:
  // Declares --exit-interval, --exit-duration-in-mins and --exit-signal-handler.
  static void declareFlags(Flags& flags);
  // Reads them (an error names the flag and its range); installs the signal handler when asked. The run's clock
  // starts here.
  static Result<EarlyExit> fromFlags(const Flags& flags);

  bool any() const { return interval_ > 0 || minutes_ > 0 || onSignal_; }
  // This process's reason to stop after step `iteration` (None: go on).
  ExitReason reasonAfter(int64_t iteration) const;
  // "--exit-interval 100 (step 300)", "the signal SIGTERM", ...: for the stop line.
  std::string describe(ExitReason r, int64_t iteration) const;

 private:
  int64_t interval_ = 0;
  double minutes_ = 0;
  bool onSignal_ = false;
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
};

// The signal --exit-signal-handler caught (0: none yet). The first SIGTERM or SIGINT is caught; the handler then
// restores the default action, so a second one ends the process at once.
int exitSignalCaught();

}  // namespace tpc::cli
