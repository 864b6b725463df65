#include "models/sampling.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace tpc {

SamplingCandidates samplingCandidates(std::span<const float> logits, const SamplingOptions& options) {
  const int64_t n = static_cast<int64_t>(logits.size());
  SamplingCandidates c;
  if (n == 0) return c;
  if (options.temperature == 0) {
    c.ids = {static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin())};
    c.weights = {1.0};
    return c;
  }
  int64_t k = options.topK > 0 ? std::min(options.topK, n) : n;
  std::vector<int32_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  auto before = [&](int32_t a, int32_t b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); };
  std::partial_sort(order.begin(), order.begin() + k, order.end(), before);
  // Hugging Face's TopKLogitsWarper removes only the tokens below the k-th logit: tokens tied with it stay.
  const int64_t topK = k;
  for (int64_t j = topK; j < n; ++j)
    if (logits[order[j]] == logits[order[topK - 1]]) std::swap(order[k++], order[j]);
  std::sort(order.begin() + topK, order.begin() + k, before);
  order.resize(k);
  std::vector<double> w(k);
  double sum = 0;
  for (int64_t j = 0; j < k; ++j) sum += w[j] = std::exp((logits[order[j]] - logits[order[0]]) / options.temperature);
  if (options.topP < 1) {
    // Hugging Face's TopPLogitsWarper drops a token when the tokens less likely than it hold at most 1 - top_p:
    // what is kept is the shortest prefix whose probability reaches top_p, and never less than one token.
    int64_t keep = 0;
    for (double mass = 0; keep < k && mass < options.topP; ++keep) mass += w[keep] / sum;
    order.resize(keep);
    w.resize(keep);
  }
  c.ids = std::move(order);
  c.weights = std::move(w);
  return c;
}

int32_t sampleToken(std::span<const float> logits, const SamplingOptions& options, std::mt19937_64& rng) {
  SamplingCandidates c = samplingCandidates(logits, options);
  if (options.temperature == 0) return c.ids[0];
  double u = std::uniform_real_distribution<double>(0, std::accumulate(c.weights.begin(), c.weights.end(), 0.0))(rng);
  size_t j = 0;
  while (j + 1 < c.ids.size() && u >= c.weights[j]) u -= c.weights[j++];
  return c.ids[j];
}

}  // namespace tpc
