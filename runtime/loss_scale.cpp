// The dynamic loss scale's rules (loss_scale.h).
#include "runtime/loss_scale.h"

#include <algorithm>
#include <cmath>

namespace tpc {

Status LossScaleSettings::validate() const {
  // Powers of two are customary (the scaling is then exact) but not required.
  if (!(min > 0) || !std::isfinite(min))
    return makeError("--min-loss-scale=", min, " must be a positive number (e.g. 1)");
  if (!(initial >= min) || !std::isfinite(initial) || initial > 1e30)
    return makeError("--initial-loss-scale=", initial, " must be at least --min-loss-scale=", min,
                     " and at most 1e30 (e.g. 65536)");
  if (window < 1) return makeError("--loss-scale-window=", window, " must be at least 1 (e.g. 1000)");
  if (hysteresis < 1) return makeError("--hysteresis=", hysteresis, " must be at least 1 (1: halve at every overflow)");
  return {};
}

DynamicLossScaler::DynamicLossScaler(LossScaleSettings settings, double scale, int64_t goodSteps, int64_t hysteresisLeft)
    : settings_(settings),
      scale_(scale > 0 ? scale : settings.initial),
      goodSteps_(goodSteps),
      hysteresisLeft_(hysteresisLeft >= 0 ? std::min(hysteresisLeft, settings.hysteresis) : settings.hysteresis) {}

Status DynamicLossScaler::update(bool finite, int64_t step) {
  if (finite) {
    // Doubling stops where the f32 scale input would overflow.
    if (++goodSteps_ >= settings_.window && scale_ < 1e30) {
      scale_ *= 2;
      goodSteps_ = 0;
      hysteresisLeft_ = settings_.hysteresis;
    }
    return {};
  }
  goodSteps_ = 0;
  if (hysteresisLeft_ > 0) --hysteresisLeft_;
  if (hysteresisLeft_ > 0) return {};  // the scale is kept: an overflow now and then is no reason to lower it
  if (scale_ / 2 < settings_.min)
    return makeError("step ", step, ": the gradients are not finite at loss scale ", scale_, ", and halving it would go "
                     "below --min-loss-scale=", settings_.min, ": the run diverged (lower --lr, raise --lr-warmup-iters, "
                     "or train in --precision bf16)");
  scale_ /= 2;
  return {};
}

}  // namespace tpc
