// GPT-2's pre-tokenization, written out by hand instead of with a regex engine. It splits text exactly as
//   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
// does under Python's regex module; BPE then runs on each piece separately.
#pragma once

#include <string_view>
#include <vector>

namespace tpc {

class Gpt2Pretokenizer {
 public:
  explicit Gpt2Pretokenizer(std::string_view text) : text_(text) {}
  // Sets piece to the next pre-token and returns true, or returns false at the end of the text.
  // Bytes that are not valid UTF-8 are taken one at a time as punctuation (never read past the text).
  bool next(std::string_view& piece);

 private:
  std::string_view text_;
  size_t pos_ = 0;
};

// All pre-tokens of text, in order.
std::vector<std::string_view> gpt2Pretokenize(std::string_view text);

}  // namespace tpc
