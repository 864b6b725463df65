// `tpc run --tensorboard-dir DIR`: the run's figures as a TensorBoard event file (what Megatron-LM's
// --tensorboard-dir and PyTorch's SummaryWriter write), under Megatron-LM's tags ("lm loss", "learning-rate",
// "grad-norm", "lm loss validation", ...) so that tpc's runs and Megatron-LM's plot side by side.
//
// The format: a file of records, each a little-endian uint64 length, the masked CRC-32C of those 8 bytes, the
// bytes of one serialized tensorflow.Event protobuf, and their masked CRC-32C. The first event holds the file
// version ("brain.Event:2"); each later one a wall time, a step and a Summary of scalar values (simple_value).
#pragma once

#include <cstdint>
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <string_view>

#include "ir/status.h"

namespace tpc {

// CRC-32C (Castagnoli), as TFRecord files use it; masked as TensorFlow masks it.
uint32_t crc32c(std::string_view bytes);
uint32_t maskedCrc32c(std::string_view bytes);

class TensorBoardWriter {
 public:
  // Checks that DIR is, or can be made, a writable folder. Nothing is written until the first scalar.
  static Result<std::unique_ptr<TensorBoardWriter>> open(const std::string& dir);
  ~TensorBoardWriter();

  // One event of scalars at `step` (tag -> value); the file and the folder are made at the first call. Written
  // through to the file at once, so that TensorBoard shows a running job.
  Status scalars(int64_t step, const std::map<std::string, double>& values);
  // The event file ("" before the first scalar).
  const std::string& path() const { return path_; }

  // The trainer's figures (TrainerSettings::publish: "loss", "lr", "valid_loss", ...) under Megatron-LM's tags;
  // figures without a step key take the last step seen. The first write failure is returned once, then the
  // writer stops writing.
  Status publish(const std::map<std::string, double>& figures);

 private:
  TensorBoardWriter() = default;
  Status writeEvent(const std::string& event);
  std::string dir_, path_;
  std::FILE* file_ = nullptr;
  int64_t lastStep_ = 0;
  bool failed_ = false;
};

}  // namespace tpc
