// Learning-rate schedules as Megatron-LM computes them: linear warmup, then cosine/linear decay to
// min-lr over the decay iterations, constant after.
#pragma once

#include <cstdint>
#include <string>

#include "ir/status.h"

namespace tpc {

struct LrSchedule {
  double maxLr = 6e-4, minLr = 6e-5;
  int64_t warmupIters = 0;
  int64_t decayIters = 0;             // iterations from 0 to the end of decay
  std::string style = "cosine";       // cosine | linear | constant

  Status validate() const;
  // The lr for 1-based iteration `it`.
  double at(int64_t it) const;
};

}  // namespace tpc
