// Megatron-LM's dataset blends: `--data-path 0.3 web 0.7 books` trains on two indexed datasets, drawing 30% of the
// windows from the first and 70% from the second; `--data-path web books` weighs them by their sizes. Each dataset
// is split into train/valid/test by --split on its own, as Megatron-LM does, and each split blends the same way.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "frontend/indexed_dataset.h"
#include "frontend/token_windows.h"
#include "ir/status.h"

namespace tpc {

struct DataBlendEntry {
  std::string prefix;
  double weight = 0;  // as given (not normalized); 0 when the blend has no weights
};

// The words of a --data-path value (or of a model file's data_path): one prefix, prefixes alone, or weight-prefix
// pairs ("0.3 A 0.7 B"). Words are split at newlines where the value has any (Flags::words joins words that hold
// spaces so), else at whitespace, except that a value `isDataset` accepts whole is one prefix ("my data/web"). One
// word is a prefix, even a number. Weights must be positive and finite; a blend gives all of them or none. Errors
// name the word and the expected form, and the value as `name` ("--data-path", or a model file's field).
Result<std::vector<DataBlendEntry>> parseDataBlend(std::string_view spec,
                                                   const std::function<bool(const std::string&)>& isDataset = {},
                                                   const std::string& name = "--data-path");

// A word that names a model file (.fb or .json), which a --data-path prefix does not: the commands say when one
// landed among --data-path's words.
bool looksLikeModelFile(const std::string& word);

// Megatron's build_blending_indices: sample s goes to the dataset furthest below its share, the dataset i with the
// largest weight_i * max(s, 1) - taken_i (the first such on a tie). Deterministic, so a position alone resumes it.
class BlendOrder {
 public:
  explicit BlendOrder(std::vector<double> weights);  // normalized here; at least one, all positive
  size_t next();                                     // the dataset of the next sample
  // As after `position` calls of next() from the start: replayed, as Megatron builds its blending indices at every
  // start (about 5 ns a sample for two datasets). With `taken`, the counts takenAt() gave for that position, the state
  // is set at once; counts that cannot be that position's (another blend's, or damaged) are replayed over. A
  // position past kMaxReplay to replay is an error.
  Status seek(uint64_t position, const std::vector<uint64_t>& taken = {});
  // Whether `taken` could be the counts at `position` of this blend: one a dataset, summing to it, each near its share.
  bool fits(uint64_t position, const std::vector<uint64_t>& taken) const;
  // The samples each dataset had given at an earlier `position`, within the last keepRecent() samples (empty when
  // it is further back): what a checkpoint of that position stores for seek.
  std::vector<uint64_t> takenAt(uint64_t position) const;
  void keepRecent(size_t samples);
  uint64_t position() const { return position_; }
  const std::vector<uint64_t>& taken() const { return taken_; }
  const std::vector<double>& weights() const { return weights_; }

  // The largest position seek replays; further is a damaged checkpoint (2^36 samples: 15T tokens at seq 256).
  static constexpr uint64_t kMaxReplay = uint64_t(1) << 36;

 private:
  std::vector<double> weights_;
  std::vector<uint64_t> taken_;
  uint64_t position_ = 0;
  std::vector<uint32_t> recent_;  // the dataset of sample p at recent_[p % size()], for the last size() samples
  uint64_t recentFrom_ = 0;       // the first position recent_ holds
};

// One split's training windows over every dataset of a blend: each dataset's TokenWindows (its own seeded order
// and epochs), interleaved in BlendOrder. With one dataset it reads exactly that dataset's TokenWindows.
class BlendedWindows {
 public:
  struct Part {
    IndexedDataset data;
    DocRange docs;
    double weight = 0;  // 0 for every part: weighed by their windows per epoch (Megatron's unweighted blend)
  };
  // Errors (a part's empty range, too few tokens) are reported by status(), naming the part's prefix.
  BlendedWindows(std::vector<Part> parts, uint32_t seqLen, uint64_t seed);

  Status status() const { return status_; }
  Status next(int32_t* out);
  uint64_t position() const { return order_ ? order_->position() : 0; }
  // BlendOrder's seek and takenAt, over every part (taken: empty with one part, which needs none).
  Status seek(uint64_t position, const std::vector<uint64_t>& taken = {});
  std::vector<uint64_t> takenAt(uint64_t position) const;
  void keepRecent(size_t samples) {
    if (order_) order_->keepRecent(samples);
  }
  // Windows per epoch over all parts (an epoch of each at once when weighed by size).
  uint64_t windowsPerEpoch() const;
  size_t numParts() const { return parts_.size(); }
  const IndexedDataset& data(size_t i) const { return parts_[i]->data; }
  const TokenWindows& windows(size_t i) const { return parts_[i]->windows; }
  // The normalized share of windows each part gives.
  double share(size_t i) const { return order_ ? order_->weights()[i] : 0; }

 private:
  struct Held {
    IndexedDataset data;
    TokenWindows windows;  // refers to data: Held never moves
    Held(IndexedDataset d, DocRange docs, uint32_t seqLen, uint64_t seed)
        : data(std::move(d)), windows(data, docs, seqLen, seed) {}
  };
  std::vector<std::unique_ptr<Held>> parts_;
  std::unique_ptr<BlendOrder> order_;
  Status status_;
};

}  // namespace tpc
