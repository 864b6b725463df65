// Ending a training run early: --exit-interval, --exit-duration-in-mins, --exit-signal-handler.
#include "tools/early_exit.h"

#include <signal.h>

#include <atomic>
#include <cmath>
#include <cstring>

namespace tpc::cli {

namespace {

std::atomic<int> gCaught{0};
static_assert(std::atomic<int>::is_always_lock_free);

void onExitSignal(int sig) {
  int none = 0;
  gCaught.compare_exchange_strong(none, sig);
  ::signal(sig, SIG_DFL);  // a second one ends the process
}

void installExitSignalHandler() {
  for (int sig : {SIGTERM, SIGINT}) {
    struct sigaction sa {};
    sa.sa_handler = onExitSignal;
    sa.sa_flags = SA_RESTART;  // the write it interrupts goes on (stdio does not retry EINTR: `tpc run | tee`)
    sigemptyset(&sa.sa_mask);
    ::sigaction(sig, &sa, nullptr);
  }
}

}  // namespace

int exitSignalCaught() { return gCaught.load(); }

void EarlyExit::declareFlags(Flags& flags) {
  flags.value("exit-interval", "end the run after every step divisible by N, with a checkpoint when --save is given (as Megatron-LM's)")
      .value("exit-duration-in-mins", "end the run after the step during which it passed M minutes, with a checkpoint when --save is given (a job's time limit)")
      .toggle("exit-signal-handler", "on SIGTERM (a scheduler's notice) or SIGINT (Ctrl-C), end the run after the current step, with a checkpoint when --save is given; a second signal ends it at once");
}

Result<EarlyExit> EarlyExit::fromFlags(const Flags& flags) {
  EarlyExit e;
  if (flags.has("exit-interval")) {
    TPC_ASSIGN(long long n, flags.getInt("exit-interval", 1, int64_t(1) << 40));
    e.interval_ = n;
  }
  if (flags.has("exit-duration-in-mins")) {
    TPC_ASSIGN(double m, flags.getDouble("exit-duration-in-mins"));
    if (!std::isfinite(m) || m <= 0)
      return makeError("--exit-duration-in-mins ", flags.get("exit-duration-in-mins"), " must be a positive number of minutes");
    e.minutes_ = m;
  }
  e.onSignal_ = flags.on("exit-signal-handler");
  if (e.onSignal_) installExitSignalHandler();
  return e;
}

ExitReason EarlyExit::reasonAfter(int64_t iteration) const {
  if (onSignal_ && exitSignalCaught() != 0) return ExitReason::Signal;
  if (minutes_ > 0 && std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count() >= 60 * minutes_)
    return ExitReason::Duration;
  if (interval_ > 0 && iteration % interval_ == 0) return ExitReason::Interval;
  return ExitReason::None;
}

std::string EarlyExit::describe(ExitReason r, int64_t iteration) const {
  switch (r) {
    case ExitReason::Interval: return cat("--exit-interval ", interval_, " (step ", iteration, ")");
    case ExitReason::Duration: return cat("--exit-duration-in-mins ", minutes_, " (the run passed it)");
    case ExitReason::Signal: {
      const int sig = exitSignalCaught();
      return sig == SIGTERM ? "the signal SIGTERM (--exit-signal-handler)"
             : sig == SIGINT ? "the signal SIGINT (--exit-signal-handler)"
                             : "a signal on another rank (--exit-signal-handler)";
    }
    case ExitReason::None: break;
  }
  return "";
}

}  // namespace tpc::cli
