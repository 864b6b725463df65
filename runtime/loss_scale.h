// Dynamic loss scaling for fp16 training (as PyTorch's GradScaler and Megatron's DynamicGradScaler): the
// loss is multiplied by a scale before the backward; a step whose gradients overflow is skipped and the
// scale halved; after `window` good steps in a row the scale doubles.
#pragma once

#include <cstdint>

#include "ir/status.h"

namespace tpc {

struct LossScaleSettings {
  double initial = 65536;  // 2^16 (--initial-loss-scale)
  int64_t window = 1000;   // good steps before the scale doubles (--loss-scale-window)
  double min = 1;          // a halving below this ends the run (--min-loss-scale)
  // An error naming the flag when a value is out of range.
  Status validate() const;
};

class DynamicLossScaler {
 public:
  // `scale` and `goodSteps`: where a resumed run left off (scale 0: start at settings.initial).
  explicit DynamicLossScaler(LossScaleSettings settings, double scale = 0, int64_t goodSteps = 0);
  double scale() const { return scale_; }
  int64_t goodSteps() const { return goodSteps_; }  // finite steps since the last change of the scale
  // After a step: a finite one counts toward the window (and doubles the scale when it is full); a
  // non-finite one halves the scale, or fails when that would go below the minimum.
  Status update(bool finite, int64_t step);

 private:
  LossScaleSettings settings_;
  double scale_;
  int64_t goodSteps_;
};

}  // namespace tpc
