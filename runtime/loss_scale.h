// Dynamic loss scaling for fp16 training (as PyTorch's GradScaler and Megatron's DynamicGradScaler): the
// loss is multiplied by a scale before the backward; a step whose gradients overflow is skipped, and the scale is
// halved from the `hysteresis`-th overflow on; after `window` good steps in a row the scale doubles (which also
// restores the hysteresis), as Megatron-LM's DynamicGradScaler does.
#pragma once

#include <cstdint>

#include "ir/status.h"

namespace tpc {

struct LossScaleSettings {
  double initial = 65536;  // 2^16 (--initial-loss-scale)
  int64_t window = 1000;   // good steps before the scale doubles (--loss-scale-window)
  double min = 1;          // a halving below this ends the run (--min-loss-scale)
  int64_t hysteresis = 2;  // overflows, counted since the scale last doubled, before it is halved (--hysteresis)
  // An error naming the flag when a value is out of range.
  Status validate() const;
};

class DynamicLossScaler {
 public:
  // `scale`, `goodSteps` and `hysteresisLeft`: where a resumed run left off (scale 0: start at settings.initial;
  // hysteresisLeft < 0: settings.hysteresis).
  explicit DynamicLossScaler(LossScaleSettings settings, double scale = 0, int64_t goodSteps = 0,
                             int64_t hysteresisLeft = -1);
  double scale() const { return scale_; }
  int64_t goodSteps() const { return goodSteps_; }  // finite steps since the last overflow or doubling
  int64_t hysteresisLeft() const { return hysteresisLeft_; }  // overflows before the next halving (0: the next one)
  // After a step: a finite one counts toward the window (and doubles the scale when it is full); a non-finite one
  // counts down the hysteresis and then halves the scale, or fails when that would go below the minimum.
  Status update(bool finite, int64_t step);

 private:
  LossScaleSettings settings_;
  double scale_;
  int64_t goodSteps_;
  int64_t hysteresisLeft_;
};

}  // namespace tpc
