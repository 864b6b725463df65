// Next-token sampling (models/sampling.h): temperature, top-k and top-p applied in Hugging Face generate's
// order, on logits whose probabilities are known, so that the kept set can be said exactly.
#include <catch2/catch.hpp>

#include <cmath>
#include <set>

#include "models/sampling.h"

namespace tpc {
namespace {

// Probabilities 1/8, 1/4, 1/2, 1/8: by likelihood ids 2, 1, then 0 and 3 (equal, so by id).
const std::vector<float> kLogits = {0.f, std::log(2.f), std::log(4.f), 0.f};

std::vector<int32_t> kept(const std::vector<float>& logits, SamplingOptions o) {
  return samplingCandidates(logits, o).ids;
}
SamplingOptions topP(double p, double temperature = 1, int64_t topK = 0) { return {temperature, topK, p}; }

}  // namespace

TEST_CASE("sampling: top-p keeps the fewest most likely tokens whose probability reaches P", "[sample][sampling]") {
  using Ids = std::vector<int32_t>;
  CHECK(kept(kLogits, topP(1.0)) == Ids{2, 1, 0, 3});  // off: every token, most likely first
  CHECK(kept(kLogits, topP(1e-6)) == Ids{2});          // P small: the argmax alone
  CHECK(kept(kLogits, topP(0.3)) == Ids{2});
  CHECK(kept(kLogits, topP(0.6)) == Ids{2, 1});        // 1/2 < 0.6 <= 3/4
  CHECK(kept(kLogits, topP(0.8)) == Ids{2, 1, 0});     // 3/4 < 0.8 <= 7/8: of the equal 0 and 3, the lower id
  CHECK(kept(kLogits, topP(0.9)) == Ids{2, 1, 0, 3});
  // Equal logits at the top: the lower id, whatever their place in the vector.
  CHECK(kept({1.f, 3.f, 3.f, 2.f}, topP(0.1)) == Ids{1});
  CHECK(kept({5.f, 5.f}, topP(0.4)) == Ids{0});
  CHECK(kept({5.f, 5.f}, topP(0.6)) == Ids{0, 1});
  // The weights are the softmax's, unnormalized: 1/2 against 1/4.
  auto c = samplingCandidates(kLogits, topP(0.6));
  REQUIRE(c.weights.size() == 2);
  CHECK(c.weights[0] / c.weights[1] == Approx(2.0));
}

TEST_CASE("sampling: temperature first, then top-k, then top-p over what top-k kept", "[sample][sampling]") {
  using Ids = std::vector<int32_t>;
  // Temperature 0.5 sharpens to 1/22, 4/22, 16/22, 1/22: 0.7 is reached by the argmax alone.
  CHECK(kept(kLogits, topP(0.7, 1.0)) == Ids{2, 1});
  CHECK(kept(kLogits, topP(0.7, 0.5)) == Ids{2});
  // Temperature 2 flattens to 0.37, 0.26, 0.18, 0.18: 0.7 needs three.
  CHECK(kept(kLogits, topP(0.7, 2.0)) == Ids{2, 1, 0});
  // top-k 2 leaves ids 2 and 1 at 2/3 and 1/3 (renormalized, as Hugging Face's top-p softmaxes what top-k left):
  // 0.6 is reached by id 2 alone, where over all four tokens it would take two.
  CHECK(kept(kLogits, topP(0.6, 1.0, 2)) == Ids{2});
  CHECK(kept(kLogits, topP(0.7, 1.0, 2)) == Ids{2, 1});
  // top-k alone, equal logits at its edge: both stay, as Hugging Face's TopKLogitsWarper removes only the tokens
  // below the k-th logit.
  CHECK(kept(kLogits, topP(1.0, 1.0, 3)) == Ids{2, 1, 0, 3});
  CHECK(kept({1.f, 2.f, 2.f, 0.f}, topP(1.0, 1.0, 1)) == Ids{1, 2});
  CHECK(kept({2.f, 0.f, 2.f, 2.f, 1.f}, topP(1.0, 1.0, 2)) == Ids{0, 2, 3});
  CHECK(kept({3.f, 1.f, 2.f, 1.f}, topP(1.0, 1.0, 2)) == Ids{0, 2});
  // Greedy ignores both.
  CHECK(kept(kLogits, topP(0.9, 0.0, 3)) == Ids{2});
}

TEST_CASE("sampling: draws land in the kept set only", "[sample][sampling]") {
  std::mt19937_64 rng(7);
  std::set<int32_t> seen;
  for (int i = 0; i < 400; ++i) seen.insert(sampleToken(kLogits, topP(0.6), rng));
  CHECK(seen == std::set<int32_t>{1, 2});
  seen.clear();
  for (int i = 0; i < 400; ++i) seen.insert(sampleToken(kLogits, topP(1e-6), rng));
  CHECK(seen == std::set<int32_t>{2});
  seen.clear();
  for (int i = 0; i < 400; ++i) seen.insert(sampleToken(kLogits, topP(1.0), rng));
  CHECK(seen == std::set<int32_t>{0, 1, 2, 3});
}

}  // namespace tpc
