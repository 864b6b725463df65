// Parameter initialization from a parameter's InitSpec. Each tensor's values depend only on (seed,
// parameter name, element index), so every sharding and every backend starts from the same weights.
#pragma once

#include <cstdint>

#include "ir/graph.h"
#include "ir/status.h"
#include "runtime/host_tensor.h"

namespace tpc {

// A tensor of v's type (f32, or f64 when `fp64`) filled by v's initializer (zeros when it has none). An f32
// normal draw comes back deferred (HostTensor::deferred, pendingNormalDraw): made on first access, or by
// the backend itself.
HostTensor initParam(const Value& v, uint64_t seed, bool fp64 = false);
// The text of the draw's functions (runtime/normal_draw.h) for a GPU kernel to paste: tpc_splitmix64,
// tpc_normal_draw and their helpers, after definitions of TPC_HD, tpc_float_bits and tpc_bits_float.
const char* normalDrawSource();

// Checked before initParam allocates anything: a model file may declare shapes of up to 2^50 elements,
// and allocating the state of such a model would abort (std::bad_alloc) or, with overcommit, page in
// until the OOM killer ends the run. An error when the host state of `step` (every parameter, including
// the optimizer moments, at `bytesPerFloat` per float element) exceeds `limitBytes`, naming the largest
// parameter; `source` (the model file) starts the message.
Status checkStateFitsInMemory(const Graph& step, int64_t bytesPerFloat, uint64_t limitBytes, const std::string& source);
// This machine's physical memory, for the limit above.
uint64_t physicalMemoryBytes();

}  // namespace tpc
