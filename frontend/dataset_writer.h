// Writes a Megatron indexed dataset (see indexed_dataset.h) one document at a time, each document one
// sequence. Tokens stream to a temporary file of this writer's own (see FileCommit); finish() writes the index
// beside it and moves both into place as one, so a failed or interrupted run, or another run writing the same
// PREFIX at the same time, never leaves a .bin paired with another run's .idx. A writer destroyed before finish()
// removes its temporary files, so a failed run leaves nothing behind.
#pragma once

#include <cstdint>
#include <cstdio>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "frontend/indexed_dataset.h"
#include "ir/file_io.h"
#include "ir/status.h"

namespace tpc {

class DatasetWriter {
 public:
  // dtype must be an integer dtype; ids written must fit it.
  static Result<DatasetWriter> create(const std::string& prefix, TokenDType dtype);
  DatasetWriter(DatasetWriter&&) noexcept;
  DatasetWriter& operator=(DatasetWriter&&) = delete;
  ~DatasetWriter();

  Status addDocument(std::span<const int32_t> tokens);
  // Writes the index and renames both files to PREFIX.bin and PREFIX.idx.
  Status finish();

  uint64_t numDocuments() const { return lengths_.size(); }
  uint64_t numTokens() const { return numTokens_; }

  // The bytes of an index for the given sequence lengths (one document per sequence).
  static std::string indexBytes(TokenDType dtype, std::span<const int32_t> lengths);

 private:
  DatasetWriter() = default;
  void discard();

  std::string prefix_, binTmp_;
  FileCommit output_;  // PREFIX.bin (streamed to binTmp_) and PREFIX.idx; Ctrl-C mid-write leaves no temporary either
  std::FILE* bin_ = nullptr;
  TokenDType dtype_ = TokenDType::UInt16;
  std::vector<int32_t> lengths_;
  std::vector<uint8_t> buffer_;
  uint64_t numTokens_ = 0;
  bool finished_ = false;
};

}  // namespace tpc
