// Progress of a long job on stderr: a redrawn bar with rate and ETA on a terminal, else a plain line
// every few seconds (so logs of batch jobs stay readable). Silent for jobs that end within a second.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace tpc {

class ProgressMeter {
 public:
  // label: shown first ("prepare"); totalBytes: the input size that 100% stands for.
  ProgressMeter(std::string label, uint64_t totalBytes, bool enabled = true);
  // Called as work completes, with running totals; cheap (draws at most ~10 times a second).
  void update(uint64_t bytesDone, uint64_t tokensDone);
  // Clears the bar (on a terminal) before the caller prints its summary or an error.
  void finish();

 private:
  void draw(uint64_t bytesDone, uint64_t tokensDone, double elapsed);

  std::string label_;
  uint64_t total_;
  bool enabled_, tty_, drawn_ = false;
  std::chrono::steady_clock::time_point start_, lastDraw_;
};

}  // namespace tpc
