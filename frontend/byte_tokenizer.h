// The byte-level tokenizer for tiny models: id b is byte b, id 256 is the end of a document.
#pragma once

#include "frontend/tokenizer.h"

namespace tpc {

class ByteTokenizer final : public Tokenizer {
 public:
  static constexpr int32_t kEod = 256;
  const std::string& name() const override;
  int32_t vocabSize() const override { return 257; }
  int32_t eod() const override { return kEod; }
  // Any bytes at all, valid UTF-8 or not.
  Status encode(std::string_view text, std::vector<int32_t>& out) const override;
  // The EOD id decodes to "<|endoftext|>", as GPT-2's does.
  Status decode(std::span<const int32_t> ids, std::string& out) const override;
};

}  // namespace tpc
