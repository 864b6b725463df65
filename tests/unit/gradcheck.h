// Whole-graph gradient checks: appendGradients on a forward graph vs central finite differences of its
// loss, both evaluated by the CPU reference executor in fp64.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "ir/graph.h"

namespace tpc::test {

struct GradcheckResult {
  double worstRelError = 0;
  std::string worst;  // "param[index]: analytic a, numeric n"
  int checked = 0;
};

// Perturbs `coordsPerParam` random coordinates of every parameter of `g` (whose output `lossName` is a
// scalar) and compares. Integer inputs are drawn in [0, intRange); parameters from N(0, 0.1), plus 1 for
// those whose name `isOne` accepts (LayerNorm gains). Relative error: |a-n| / max(|a|, |n|, 1e-3).
GradcheckResult gradcheckGraph(Graph& g, const std::string& lossName, int64_t intRange, int coordsPerParam,
                               uint64_t seed, const std::function<bool(const std::string&)>& isOne);

}  // namespace tpc::test
