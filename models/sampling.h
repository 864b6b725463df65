// Next-token sampling from one position's logits in Hugging Face generate's order: temperature, then top-k,
// then top-p (nucleus), then one draw from the tokens left. Kept apart from `tpc sample` to be tested on
// logits of its own, without a checkpoint.
#pragma once

#include <cstdint>
#include <random>
#include <span>
#include <vector>

namespace tpc {

struct SamplingOptions {
  double temperature = 1;  // > 0; 0: greedy (the argmax)
  int64_t topK = 0;        // the K most likely tokens only; 0: all
  double topP = 1;         // in (0, 1]: the smallest most likely set whose probability reaches it; 1: all
};

// The tokens a draw may pick, most likely first, and their weights: softmax(logits / temperature) unnormalized,
// after the top-k and top-p cuts (top-p's probabilities are those among the top-k, as Hugging Face's warpers
// chain). Equal logits are ordered by id, the lower first, so the cuts do not depend on the sort. Greedy keeps
// the argmax alone (the lowest id among equals). The logits must be finite and not empty.
struct SamplingCandidates {
  std::vector<int32_t> ids;
  std::vector<double> weights;
};
SamplingCandidates samplingCandidates(std::span<const float> logits, const SamplingOptions& options);

// One token of samplingCandidates, drawn by weight with `rng` (greedy draws nothing from it).
int32_t sampleToken(std::span<const float> logits, const SamplingOptions& options, std::mt19937_64& rng);

}  // namespace tpc
