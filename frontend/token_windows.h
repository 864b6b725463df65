// What the trainer reads from an indexed dataset: Megatron's train/valid/test split by documents, and
// TokenWindows, the seq+1-token training windows in a seeded shuffled order that resumes exactly.
#pragma once

#include <array>
#include <cstdint>
#include <string_view>
#include <vector>

#include "frontend/indexed_dataset.h"
#include "ir/status.h"

namespace tpc {

// Documents [begin, end) of a dataset.
struct DocRange {
  uint64_t begin = 0, end = 0;
  uint64_t size() const { return end - begin; }
  bool operator==(const DocRange&) const = default;
};

struct DocSplits {
  DocRange train, valid, test;
};

// Megatron's --split "949,50,1" (or "949/50/1", or "1"): weights normalized to sum 1, missing ones 0,
// and the document boundaries computed as Megatron's get_train_valid_test_split_ does (each part
// rounded half-to-even, then all boundaries shifted so the last is numDocuments).
Result<DocSplits> splitDocuments(std::string_view spec, uint64_t numDocuments);
// The train, valid and test weights of a --split spec, as splitDocuments reads them (not yet normalized); an
// error says what is wrong with the spec, to follow the field's name.
Result<std::array<double, 3>> parseSplitWeights(std::string_view spec);

// The tokens of a document range, shuffled by document and concatenated, cut into windows of seqLen + 1
// tokens that overlap by one token (window j covers tokens [j*seqLen, j*seqLen + seqLen]), the windows
// then shuffled. As in Megatron's GPT dataset, a window runs across document boundaries (the EOD ids
// the data holds separate them). Each epoch draws a new document order and a new window order from
// (seed, epoch); the trailing tokens that do not fill a window are dropped in that epoch.
// position() counts the windows returned so far: epoch = position / windowsPerEpoch. seek(position) on
// a fresh TokenWindows with the same arguments continues exactly where the saved one was.
class TokenWindows {
 public:
  // Keeps a reference to data, which must outlive this object. Errors (an empty range, a range past
  // the dataset, fewer than seqLen + 1 tokens) are reported by status() and by every next().
  TokenWindows(const IndexedDataset& data, DocRange docs, uint32_t seqLen, uint64_t seed);

  Status status() const { return status_; }
  // Writes the next window's seqLen + 1 tokens to out and advances.
  Status next(int32_t* out);
  uint64_t position() const { return position_; }
  void seek(uint64_t position) { position_ = position; }

  uint32_t seqLen() const { return seqLen_; }
  uint64_t windowsPerEpoch() const { return windowsPerEpoch_; }
  uint64_t epoch() const { return windowsPerEpoch_ ? position_ / windowsPerEpoch_ : 0; }
  uint64_t tokensInRange() const { return totalTokens_; }

 private:
  void buildEpoch(uint64_t epoch);

  const IndexedDataset* data_;
  DocRange docs_;
  uint32_t seqLen_;
  uint64_t seed_;
  Status status_;
  uint64_t totalTokens_ = 0, windowsPerEpoch_ = 0, position_ = 0;
  // The current epoch's document order, its token prefix sums, and its window order.
  uint64_t builtEpoch_ = ~0ull;
  std::vector<uint64_t> docOrder_, prefix_, windowOrder_;
};

// A permutation of [0, n) drawn from (seed, stream) by Fisher-Yates with a fixed generator, the same on
// every platform and standard library.
std::vector<uint64_t> seededPermutation(uint64_t n, uint64_t seed, uint64_t stream);

}  // namespace tpc
