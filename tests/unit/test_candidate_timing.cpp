// The pure parts of the autotuner's sustained ranking (runtime/cuda/candidate_timing.h): the orders of its
// rounds, the median of a candidate's rounds, the first fastest of the candidates, and TPC_AUTOTUNE_SUSTAINED's
// values. The timing itself needs a GPU (tests/gpu/test_matmul_autotune_gpu.cpp).
#ifdef TPC_HAVE_CUDA

#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdlib>
#include <map>

#include "runtime/cuda/candidate_timing.h"

namespace tpc::cuda {
namespace {

TEST_CASE("candidate timing: each round is an order of every candidate, and none follows the same one in all three",
          "[autotune]") {
  for (size_t count : {1u, 2u, 3u, 5u, 8u, 16u}) {
    INFO("count " << count);
    std::vector<size_t> runs;  // the three rounds one after another, as the GPU runs them
    std::vector<std::vector<size_t>> orders;
    for (int r = 0; r < 3; ++r) {
      std::vector<size_t> o = candidateOrder(count, r);
      std::vector<size_t> sorted = o;
      std::sort(sorted.begin(), sorted.end());
      for (size_t i = 0; i < count; ++i) REQUIRE(sorted[i] == i);  // each candidate exactly once
      runs.insert(runs.end(), o.begin(), o.end());
      orders.push_back(o);
    }
    CHECK((orders[0] != orders[1] || count == 1));
    // What ran just before each candidate's window in each round (none before the very first window).
    std::map<size_t, std::vector<size_t>> before;
    for (size_t j = 1; j < runs.size(); ++j) before[runs[j]].push_back(runs[j - 1]);
    if (count >= 3)
      for (size_t i = 0; i < count; ++i) {
        INFO("candidate " << i);
        const std::vector<size_t>& b = before[i];
        bool sameOther = b.size() == 3 && b[0] == b[1] && b[1] == b[2] && b[0] != i;
        CHECK_FALSE(sameOther);
      }
  }
  CHECK(candidateOrder(5, 0) == std::vector<size_t>{0, 1, 2, 3, 4});
  CHECK(candidateOrder(5, 1) == std::vector<size_t>{4, 3, 2, 1, 0});
  CHECK(candidateOrder(5, 2) == std::vector<size_t>{0, 2, 4, 1, 3});
  CHECK(candidateOrder(0, 1).empty());
}

TEST_CASE("candidate timing: the median of the rounds, and the first fastest candidate that ran", "[autotune]") {
  CHECK(medianTime({3.f, 1.f, 2.f}) == 2.f);
  CHECK(medianTime({0.5f, 9.f, 0.7f}) == 0.7f);
  CHECK(medianTime({4.f}) == 4.f);
  CHECK(medianTime({}) == -1.f);
  CHECK(fastestIndex({0.3f, 0.2f, 0.25f}) == 1);
  CHECK(fastestIndex({0.2f, 0.2f, 0.1f, 0.1f}) == 2);  // the first of equal ones
  CHECK(fastestIndex({-1.f, 0.4f, -1.f, 0.3f}) == 3);  // negative: could not run
  CHECK(fastestIndex({-1.f, -1.f}) == 0);              // none ran: the heuristic's first
  CHECK(fastestIndex({0.f, 0.1f}) == 0);               // 0 ms is a time
  CHECK(fastestIndex({}) == 0);
}

TEST_CASE("candidate timing: TPC_AUTOTUNE_SUSTAINED takes 0 or 1 and names any other value", "[autotune]") {
  const char* old = std::getenv("TPC_AUTOTUNE_SUSTAINED");
  std::string saved = old ? old : "";
  unsetenv("TPC_AUTOTUNE_SUSTAINED");
  CHECK(*candidateTimingFromEnv() == CandidateTiming::Quick);
  setenv("TPC_AUTOTUNE_SUSTAINED", "", 1);
  CHECK(*candidateTimingFromEnv() == CandidateTiming::Quick);
  setenv("TPC_AUTOTUNE_SUSTAINED", "0", 1);
  CHECK(*candidateTimingFromEnv() == CandidateTiming::Quick);
  setenv("TPC_AUTOTUNE_SUSTAINED", "1", 1);
  CHECK(*candidateTimingFromEnv() == CandidateTiming::Sustained);
  CHECK(candidateTimingKey(CandidateTiming::Sustained) == " | sustained");
  CHECK(candidateTimingKey(CandidateTiming::Quick).empty());
  for (const char* bad : {"2", "yes", "1 ", "-1"}) {
    setenv("TPC_AUTOTUNE_SUSTAINED", bad, 1);
    auto r = candidateTimingFromEnv();
    REQUIRE_FALSE(r.ok());
    CHECK(r.error() == std::string("TPC_AUTOTUNE_SUSTAINED must be 0 or 1, got '") + bad + "'");
  }
  if (old) setenv("TPC_AUTOTUNE_SUSTAINED", saved.c_str(), 1);
  else unsetenv("TPC_AUTOTUNE_SUSTAINED");
}

}  // namespace
}  // namespace tpc::cuda

#endif  // TPC_HAVE_CUDA
