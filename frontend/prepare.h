// `tpc prepare` as a library call: text or JSONL in, a Megatron indexed dataset out (see indexed_dataset.h).
#pragma once

#include <cstdint>
#include <string>

#include "frontend/tokenizer.h"
#include "ir/status.h"

namespace tpc {

struct PrepareOptions {
  std::string input;             // FILE.txt: each non-empty line a document; FILE.jsonl: one object a line
  std::string jsonKey = "text";  // the JSONL field that holds a document's text
  std::string outputPrefix;      // writes PREFIX.bin and PREFIX.idx
  bool appendEod = false;        // put the tokenizer's end-of-document id after each document
  int workers = 1;               // tokenizing threads; the output does not depend on it
  bool progress = true;          // progress on stderr for long inputs
};

struct PrepareStats {
  uint64_t documents = 0, tokens = 0, inputBytes = 0;
  double seconds = 0;
};

// Tokenizes opts.input with tokenizer and writes the dataset. Input must be UTF-8. Blank lines and
// documents with empty text are skipped. On any error (naming the file and line) nothing is written:
// the output goes to temporary files of this run's own and PREFIX.bin and PREFIX.idx are replaced together only when
// everything succeeded (see FileCommit in ir/file_io.h).
Result<PrepareStats> prepareDataset(const PrepareOptions& opts, const Tokenizer& tokenizer);

}  // namespace tpc
