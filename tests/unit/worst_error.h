// The worst elementwise error of a result against its reference, for CPU and GPU tests alike. A loop of
// std::max(worst, err) keeps `worst` when err is NaN, so a result that is all NaN (Backend::step returns
// NaN without an error) would compare as exact: here a NaN error, or results of different sizes, is
// infinitely wrong, and equal values (equal infinities too) differ by 0.
#pragma once

#include <algorithm>
#include <cmath>
#include <vector>

#include "runtime/host_tensor.h"

namespace tpc::test {

// NaN read as infinitely wrong.
inline double nanAsInfinite(double err) { return std::isnan(err) ? INFINITY : err; }

// The worse of the two; folds one more error into a worst-of loop.
inline double worseOf(double worst, double err) { return std::max(worst, nanAsInfinite(err)); }

// |got - want|, 0 where they are equal.
inline double absError(double got, double want) { return got == want ? 0.0 : std::abs(got - want); }

// |got - want| / (|want| + atol), 0 where they are equal.
inline double relError(double got, double want, double atol = 0) {
  return got == want ? 0.0 : std::abs(got - want) / (std::abs(want) + atol);
}

// Largest |got[i] - want[i]|.
inline double worstAbsError(const std::vector<double>& got, const std::vector<double>& want) {
  if (got.size() != want.size()) return INFINITY;
  double worst = 0;
  for (size_t i = 0; i < got.size(); ++i) worst = worseOf(worst, absError(got[i], want[i]));
  return worst;
}
inline double worstAbsError(const HostTensor& got, const HostTensor& want) {
  if (got.numel() != want.numel()) return INFINITY;
  double worst = 0;
  for (int64_t i = 0; i < got.numel(); ++i) worst = worseOf(worst, absError(got.getAsDouble(i), want.getAsDouble(i)));
  return worst;
}

// Largest |got[i] - want[i]| / (|want[i]| + atol).
inline double worstRelError(const std::vector<double>& got, const std::vector<double>& want, double atol = 0) {
  if (got.size() != want.size()) return INFINITY;
  double worst = 0;
  for (size_t i = 0; i < got.size(); ++i) worst = worseOf(worst, relError(got[i], want[i], atol));
  return worst;
}

}  // namespace tpc::test
