// For GPU tests that compare a backend's training steps under two options: random batches for the small
// GPT of gpt_step_support.h (2 x 16 tokens); stateBytes there snapshots every parameter's bytes.
#pragma once

#include <catch2/catch.hpp>

#include <random>
#include <string>

#include "runtime/backend.h"

namespace tpc::test {

inline TensorMap batch(int64_t i, float lr) {
  std::mt19937 rng(static_cast<unsigned>(i));
  TensorMap m;
  for (const char* name : {"tokens", "targets"}) {
    HostTensor t(TensorType(DType::i32, {2, 16}));
    for (int64_t k = 0; k < t.numel(); ++k) t.data<int32_t>()[k] = static_cast<int32_t>(rng() % 100);
    m[name] = t;
  }
  m["lr"] = HostTensor::scalarF32(lr);
  m["step"] = HostTensor::scalarF32(static_cast<float>(i));
  return m;
}

}  // namespace tpc::test
