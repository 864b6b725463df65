// Parameter initialization from a parameter's InitSpec. Each tensor's values depend only on (seed,
// parameter name, element index), so every sharding and every backend starts from the same weights.
#pragma once

#include <cstdint>

#include "ir/graph.h"
#include "runtime/host_tensor.h"

namespace tpc {

// A tensor of v's type (f32, or f64 when `fp64`) filled by v's initializer (zeros when it has none).
HostTensor initParam(const Value& v, uint64_t seed, bool fp64 = false);

}  // namespace tpc
