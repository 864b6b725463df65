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
  // The lr after `updates` applied optimizer steps (Megatron-LM's get_lr at num_steps = updates iterations): the
  // trainer's step N trains with at(N - 1 - skipped steps) and logs at(N - skipped steps).
  double at(int64_t updates) const;
};

}  // namespace tpc
