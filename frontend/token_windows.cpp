// Document split and shuffled, resumable training windows over an indexed dataset.
#include "frontend/token_windows.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdlib>
#include <numeric>
#include <string>

namespace tpc {

Result<std::array<double, 3>> parseSplitWeights(std::string_view spec) {
  // As Megatron-LM's get_train_valid_test_split_: parts by ',' (else '/'), each a Python float (spaces around it
  // allowed), missing ones 0.
  const char sep = spec.find(',') != std::string_view::npos ? ',' : spec.find('/') != std::string_view::npos ? '/' : '\0';
  std::vector<double> weights;
  size_t pos = 0;
  while (true) {
    const size_t end = sep ? spec.find(sep, pos) : std::string_view::npos;
    std::string part(spec.substr(pos, end == std::string_view::npos ? std::string_view::npos : end - pos));
    const size_t first = part.find_first_not_of(" \t"), last = part.find_last_not_of(" \t");
    part = first == std::string::npos ? std::string() : part.substr(first, last - first + 1);
    char* stop = nullptr;
    const double w = std::strtod(part.c_str(), &stop);
    // The whole part is the number (strtod would stop at a NUL byte inside it, and take what came before).
    if (part.empty() || stop != part.c_str() + part.size() || !std::isfinite(w) || w < 0)
      return makeError("'", part, "' is not a non-negative number (expected train,valid,test weights, e.g. 949,50,1)");
    weights.push_back(w);
    if (end == std::string_view::npos) break;
    pos = end + 1;
  }
  if (weights.size() > 3) return makeError("has ", weights.size(), " parts; at most three (train,valid,test, e.g. 949,50,1)");
  weights.resize(3, 0.0);
  const double sum = weights[0] + weights[1] + weights[2];
  if (!(sum > 0)) return makeError("its parts add up to 0 (e.g. 949,50,1)");
  if (!std::isfinite(sum)) return makeError("its parts add up to more than a double holds (e.g. 949,50,1)");
  return std::array<double, 3>{weights[0], weights[1], weights[2]};
}

Result<DocSplits> splitDocuments(std::string_view spec, uint64_t numDocuments) {
  auto parsed = parseSplitWeights(spec);
  if (!parsed) return makeError("--split '", spec, "': ", parsed.error());
  const std::array<double, 3>& weights = *parsed;
  const double sum = weights[0] + weights[1] + weights[2];
  // get_train_valid_test_split_: index[i+1] = index[i] + int(round(w[i] / sum * size)), then shifted.
  int64_t index[4] = {0, 0, 0, 0};
  for (int i = 0; i < 3; ++i)
    index[i + 1] = index[i] + static_cast<int64_t>(std::nearbyint(weights[i] / sum * static_cast<double>(numDocuments)));
  int64_t diff = index[3] - static_cast<int64_t>(numDocuments);
  for (int i = 1; i < 4; ++i) index[i] -= diff;
  for (int i = 1; i < 4; ++i) index[i] = std::clamp<int64_t>(index[i], index[i - 1], int64_t(numDocuments));
  DocSplits s;
  s.train = {uint64_t(index[0]), uint64_t(index[1])};
  s.valid = {uint64_t(index[1]), uint64_t(index[2])};
  s.test = {uint64_t(index[2]), uint64_t(index[3])};
  return s;
}

namespace {

// SplitMix64: a small generator with a full 64-bit state; good enough to shuffle, and fully specified.
struct SplitMix64 {
  uint64_t state;
  uint64_t next() {
    uint64_t z = (state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  // Uniform in [0, bound) without modulo bias (Lemire's multiply-and-reject).
  uint64_t below(uint64_t bound) {
    unsigned __int128 m = static_cast<unsigned __int128>(next()) * bound;
    uint64_t low = static_cast<uint64_t>(m);
    if (low < bound) {
      uint64_t threshold = -bound % bound;
      while (low < threshold) {
        m = static_cast<unsigned __int128>(next()) * bound;
        low = static_cast<uint64_t>(m);
      }
    }
    return static_cast<uint64_t>(m >> 64);
  }
};

}  // namespace

std::vector<uint64_t> seededPermutation(uint64_t n, uint64_t seed, uint64_t stream) {
  std::vector<uint64_t> p(n);
  std::iota(p.begin(), p.end(), uint64_t{0});
  SplitMix64 seeder{seed ^ (stream * 0xD1B54A32D192ED03ull)};
  SplitMix64 rng{seeder.next()};
  for (uint64_t i = n; i > 1; --i) std::swap(p[i - 1], p[rng.below(i)]);
  return p;
}

TokenWindows::TokenWindows(const IndexedDataset& data, DocRange docs, uint32_t seqLen, uint64_t seed)
    : data_(&data), docs_(docs), seqLen_(seqLen), seed_(seed) {
  if (seqLen == 0) {
    status_ = makeError("the sequence length must be at least 1");
  } else if (docs.begin > docs.end || docs.end > data.numDocuments()) {
    status_ = makeError("documents [", docs.begin, ", ", docs.end, ") are not within the ",
                        data.numDocuments(), " documents of ", data.prefix());
  } else if (docs.size() == 0) {
    status_ = makeError("no documents to read from ", data.prefix(), " (an empty split?)");
  } else {
    for (uint64_t d = docs.begin; d < docs.end; ++d) totalTokens_ += data.documentLength(d);
    if (totalTokens_ < uint64_t(seqLen) + 1)
      status_ = makeError("documents [", docs.begin, ", ", docs.end, ") of ", data.prefix(), " hold ", totalTokens_,
                          " tokens, fewer than one window of seq-length + 1 = ", uint64_t(seqLen) + 1);
    else
      windowsPerEpoch_ = (totalTokens_ - 1) / seqLen;
  }
}

void TokenWindows::buildEpoch(uint64_t epoch) {
  // Streams 2e and 2e+1: document order and window order of epoch e.
  docOrder_ = seededPermutation(docs_.size(), seed_, 2 * epoch);
  prefix_.assign(docOrder_.size() + 1, 0);
  for (size_t k = 0; k < docOrder_.size(); ++k) {
    docOrder_[k] += docs_.begin;
    prefix_[k + 1] = prefix_[k] + data_->documentLength(docOrder_[k]);
  }
  windowOrder_ = seededPermutation(windowsPerEpoch_, seed_, 2 * epoch + 1);
  builtEpoch_ = epoch;
}

Status TokenWindows::next(int32_t* out) {
  if (!status_.ok()) return status_;
  uint64_t epoch = position_ / windowsPerEpoch_;
  if (epoch != builtEpoch_) buildEpoch(epoch);
  uint64_t window = windowOrder_[position_ % windowsPerEpoch_];
  uint64_t start = window * seqLen_, remaining = uint64_t(seqLen_) + 1;
  // The document holding token `start` of the concatenation, then as many documents as the window spans.
  size_t k = static_cast<size_t>(std::upper_bound(prefix_.begin(), prefix_.end(), start) - prefix_.begin()) - 1;
  uint64_t offset = start - prefix_[k];
  while (remaining > 0) {
    TokenSpan doc = data_->document(docOrder_[k]);
    uint64_t take = std::min<uint64_t>(remaining, doc.size() - offset);
    doc.copyTo(out, offset, take);
    out += take;
    remaining -= take;
    offset = 0;
    ++k;
  }
  ++position_;
  return Status::success();
}

}  // namespace tpc
