// The tokenizer interface shared by `tpc tokenize`, `tpc prepare` and the trainer, and the factory that
// loads one by name: "gpt2" (byte-level BPE, vocabulary from dataDir()/gpt2) or "byte" (256 bytes + EOD).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "ir/status.h"

namespace tpc {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  virtual const std::string& name() const = 0;
  // Ids are in [0, vocabSize()).
  virtual int32_t vocabSize() const = 0;
  // The end-of-document id that `tpc prepare --append-eod` puts after each document.
  virtual int32_t eod() const = 0;
  // Appends the ids of text to out. Thread-safe: one tokenizer may serve many threads.
  virtual Status encode(std::string_view text, std::vector<int32_t>& out) const = 0;
  // Appends the bytes that ids stand for to out; an id outside the vocabulary is an error.
  virtual Status decode(std::span<const int32_t> ids, std::string& out) const = 0;
};

// The names loadTokenizer accepts.
std::vector<std::string> tokenizerNames();

// The ids a tokenizer of that name gives, without loading its files: gpt2 50257 (GPT-2's BPE), byte 257.
int64_t tokenizerIdCount(std::string_view name);

// Loads a tokenizer by name; a missing or malformed vocabulary file is an error naming the file.
Result<std::unique_ptr<Tokenizer>> loadTokenizer(std::string_view name);

}  // namespace tpc
