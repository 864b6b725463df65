// Checking mode of the CUDA backend (Backend::findFirstNonFinite): the first NaN or infinity of a value
// held in a device buffer, found by copying the value to the host and scanning it there (a re-run in
// checking mode is a diagnosis after a failed step, not a hot path).
#pragma once

#include <cstdint>
#include <optional>

#include "ir/graph.h"
#include "ir/status.h"

namespace tpc::cuda {

struct NonFiniteElement {
  int64_t element = 0;  // flat index of the first non-finite element
  double sample = 0;    // its value: nan, inf or -inf
};

// Scans `v`'s buffer at device address `ptr` (on the current device; the caller has synchronized the
// stream that wrote it). Integer values are never non-finite.
Result<std::optional<NonFiniteElement>> firstNonFiniteOnDevice(const Value& v, const void* ptr);

}  // namespace tpc::cuda
