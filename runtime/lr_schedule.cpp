// Learning-rate schedules.
#include "runtime/lr_schedule.h"

#include <algorithm>
#include <cmath>

namespace tpc {

Status LrSchedule::validate() const {
  if (!(maxLr > 0)) return makeError("--lr must be > 0, got ", maxLr);
  if (minLr < 0 || minLr > maxLr) return makeError("--min-lr must be in [0, lr=", maxLr, "], got ", minLr);
  if (warmupIters < 0) return makeError("--lr-warmup-iters must be >= 0, got ", warmupIters);
  if (style != "cosine" && style != "linear" && style != "constant")
    return makeError("--lr-decay-style=", style, " is not one of cosine, linear, constant");
  return {};
}

double LrSchedule::at(int64_t updates) const {
  if (warmupIters > 0 && updates <= warmupIters) return maxLr * static_cast<double>(updates) / static_cast<double>(warmupIters);
  if (style == "constant") return maxLr;
  if (updates > decayIters || decayIters <= warmupIters) return minLr;
  double ratio = static_cast<double>(updates - warmupIters) / static_cast<double>(decayIters - warmupIters);
  double coeff = style == "cosine" ? 0.5 * (std::cos(M_PI * ratio) + 1.0) : 1.0 - ratio;
  return minLr + coeff * (maxLr - minLr);
}

}  // namespace tpc
