// Progress bar / periodic progress line on stderr.
#include "frontend/progress_meter.h"

#include <unistd.h>

#include <cstdio>

namespace tpc {

ProgressMeter::ProgressMeter(std::string label, uint64_t totalBytes, bool enabled)
    : label_(std::move(label)),
      total_(totalBytes),
      enabled_(enabled),
      tty_(isatty(STDERR_FILENO) == 1),
      start_(std::chrono::steady_clock::now()),
      lastDraw_(start_) {}

void ProgressMeter::update(uint64_t bytesDone, uint64_t tokensDone) {
  if (!enabled_) return;
  auto now = std::chrono::steady_clock::now();
  double elapsed = std::chrono::duration<double>(now - start_).count();
  double sinceDraw = std::chrono::duration<double>(now - lastDraw_).count();
  if (elapsed < 1.0 || sinceDraw < (tty_ ? 0.1 : 10.0)) return;
  lastDraw_ = now;
  draw(bytesDone, tokensDone, elapsed);
}

void ProgressMeter::draw(uint64_t bytesDone, uint64_t tokensDone, double elapsed) {
  double frac = total_ ? static_cast<double>(bytesDone) / static_cast<double>(total_) : 0.0;
  if (frac > 1) frac = 1;
  double mbps = static_cast<double>(bytesDone) / 1e6 / elapsed;
  double ktps = static_cast<double>(tokensDone) / 1e3 / elapsed;
  double eta = frac > 0 ? elapsed * (1 - frac) / frac : 0;
  int etaS = static_cast<int>(eta + 0.5);
  char etaText[32];
  std::snprintf(etaText, sizeof etaText, "%d:%02d:%02d", etaS / 3600, etaS / 60 % 60, etaS % 60);
  if (tty_) {
    constexpr int kWidth = 30;
    int filled = static_cast<int>(frac * kWidth);
    std::string bar(static_cast<size_t>(filled), '#');
    bar.append(static_cast<size_t>(kWidth - filled), '.');
    std::fprintf(stderr, "\r%s [%s] %5.1f%%  %.1f MB/s  %.0fk tokens/s  ETA %s ", label_.c_str(), bar.c_str(),
                 frac * 100, mbps, ktps, etaText);
    drawn_ = true;
  } else {
    std::fprintf(stderr, "%s: %.1f%% (%.1f of %.1f MB), %.1f MB/s, %.0fk tokens/s, ETA %s\n", label_.c_str(),
                 frac * 100, static_cast<double>(bytesDone) / 1e6, static_cast<double>(total_) / 1e6, mbps, ktps,
                 etaText);
  }
  std::fflush(stderr);
}

void ProgressMeter::finish() {
  if (drawn_) std::fprintf(stderr, "\r\033[K");
  drawn_ = false;
}

}  // namespace tpc
