// GPT-2's byte-level BPE tokenizer: encoder.json (token -> id) and vocab.bpe (merges in rank order), the
// hand-written pre-tokenizer, and a per-thread cache of the BPE result of each pre-token.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "frontend/tokenizer.h"

namespace tpc {

// GPT-2's byte-to-unicode map: the printable code point that stands for byte b in encoder.json and
// vocab.bpe ('!'..'~', '¡'..'¬' and '®'..'ÿ' stand for themselves; the other bytes map to U+0100 on).
char32_t gpt2ByteToUnicode(uint8_t b);

class BpeTokenizer final : public Tokenizer {
 public:
  // Loads and checks both files; every error names the file (and the line of vocab.bpe).
  static Result<std::unique_ptr<BpeTokenizer>> load(const std::string& encoderJsonPath,
                                                     const std::string& mergesPath);

  const std::string& name() const override { return name_; }
  int32_t vocabSize() const override { return static_cast<int32_t>(tokens_.size()); }
  int32_t eod() const override { return eod_; }
  // Text must be valid UTF-8 (GPT-2's regex works on code points); "<|endoftext|>" in the text is plain
  // text, as in GPT-2's encoder.py: only the caller adds the EOD id.
  Status encode(std::string_view text, std::vector<int32_t>& out) const override;
  Status decode(std::span<const int32_t> ids, std::string& out) const override;

  // The id of the token whose raw bytes are `bytes`, or -1.
  int32_t tokenId(std::string_view bytes) const;
  // The raw bytes of token id (in range).
  const std::string& tokenBytes(int32_t id) const { return tokens_[id]; }
  size_t numMerges() const { return numMerges_; }

  // How encodePiece merges: Auto picks Scan for short pieces and Heap for long ones; both give the same
  // ids (tests compare them).
  enum class MergeStrategy { Auto, Scan, Heap };
  // BPE of one pre-token, without the cache; appends its ids to out.
  void encodePiece(std::string_view piece, std::vector<int32_t>& out,
                   MergeStrategy strategy = MergeStrategy::Auto) const;

 private:
  BpeTokenizer() = default;
  struct MergeTable;

  std::string name_ = "gpt2";
  std::vector<std::string> tokens_;                     // id -> raw bytes
  std::unordered_map<std::string, int32_t> ids_;        // raw bytes -> id
  int32_t byteIds_[256] = {};                           // id of each single byte
  int32_t eod_ = -1;
  size_t numMerges_ = 0;
  std::shared_ptr<const MergeTable> merges_;
  uint64_t instance_ = 0;                               // keys the per-thread cache to this tokenizer

  struct Candidate;
  void mergeShort(std::vector<int32_t>& sym) const;
  void mergeLong(std::vector<int32_t>& sym) const;
};

}  // namespace tpc
