// Indexed dataset writer: tokens streamed to a temporary .bin, the index written at the end, both committed as one.
#include "frontend/dataset_writer.h"

#include <cerrno>
#include <cstring>
#include <limits>
#include <utility>

namespace tpc {
namespace {

template <class T>
void appendLE(std::string& out, T v) {
  char b[sizeof(T)];
  std::memcpy(b, &v, sizeof(T));  // x86 and ARM Linux are little-endian, as the format is
  out.append(b, sizeof(T));
}

bool fitsDType(int32_t id, TokenDType d) {
  switch (d) {
    case TokenDType::UInt8: return id >= 0 && id <= 0xFF;
    case TokenDType::Int8: return id >= -128 && id <= 127;
    case TokenDType::Int16: return id >= -32768 && id <= 32767;
    case TokenDType::UInt16: return id >= 0 && id <= 0xFFFF;
    default: return true;
  }
}

}  // namespace

std::string DatasetWriter::indexBytes(TokenDType dtype, std::span<const int32_t> lengths) {
  std::string out(kIndexMagic, sizeof(kIndexMagic));
  appendLE<uint64_t>(out, kIndexVersion);
  appendLE<uint8_t>(out, static_cast<uint8_t>(dtype));
  appendLE<uint64_t>(out, lengths.size());
  appendLE<uint64_t>(out, lengths.size() + 1);
  for (int32_t len : lengths) appendLE<int32_t>(out, len);
  int64_t pointer = 0;
  for (int32_t len : lengths) {
    appendLE<int64_t>(out, pointer);
    pointer += static_cast<int64_t>(len) * static_cast<int64_t>(tokenDTypeBytes(static_cast<uint8_t>(dtype)));
  }
  for (size_t i = 0; i <= lengths.size(); ++i) appendLE<int64_t>(out, static_cast<int64_t>(i));
  return out;
}

Result<DatasetWriter> DatasetWriter::create(const std::string& prefix, TokenDType dtype) {
  if (dtype == TokenDType::Float32 || dtype == TokenDType::Float64 || tokenDTypeBytes(uint8_t(dtype)) == 0)
    return makeError("cannot write tokens as ", tokenDTypeName(uint8_t(dtype)));
  DatasetWriter w;
  w.prefix_ = prefix;
  w.dtype_ = dtype;
  w.binTmp_ = w.output_.stage(prefix + ".bin");
  w.bin_ = std::fopen(w.binTmp_.c_str(), "wb");
  if (!w.bin_) return makeError("cannot create ", prefix, ".bin (its temporary ", w.binTmp_, "): ", std::strerror(errno));
  return w;
}

DatasetWriter::DatasetWriter(DatasetWriter&& o) noexcept
    : prefix_(std::move(o.prefix_)),
      binTmp_(std::move(o.binTmp_)),
      output_(std::move(o.output_)),
      bin_(std::exchange(o.bin_, nullptr)),
      dtype_(o.dtype_),
      lengths_(std::move(o.lengths_)),
      buffer_(std::move(o.buffer_)),
      numTokens_(o.numTokens_),
      finished_(std::exchange(o.finished_, true)) {}

DatasetWriter::~DatasetWriter() {
  if (!finished_) discard();
}

void DatasetWriter::discard() {
  if (bin_) std::fclose(bin_);
  bin_ = nullptr;
  output_.discard();
  finished_ = true;
}

Status DatasetWriter::addDocument(std::span<const int32_t> tokens) {
  if (finished_ || !bin_) return makeError("internal: ", prefix_, " was already finished");
  if (tokens.size() > static_cast<size_t>(std::numeric_limits<int32_t>::max()))
    return makeError("a document of ", tokens.size(), " tokens is longer than the format's int32 lengths allow");
  const size_t item = tokenDTypeBytes(static_cast<uint8_t>(dtype_));
  buffer_.resize(tokens.size() * item);
  uint8_t* p = buffer_.data();
  for (int32_t id : tokens) {
    if (!fitsDType(id, dtype_))
      return makeError("token id ", id, " does not fit the dataset's dtype ", tokenDTypeName(uint8_t(dtype_)));
    switch (item) {
      case 1: *p = static_cast<uint8_t>(id); break;
      case 2: { uint16_t v = static_cast<uint16_t>(id); std::memcpy(p, &v, 2); break; }
      case 4: std::memcpy(p, &id, 4); break;
      default: { int64_t v = id; std::memcpy(p, &v, 8); break; }
    }
    p += item;
  }
  if (!buffer_.empty() && std::fwrite(buffer_.data(), 1, buffer_.size(), bin_) != buffer_.size())
    return makeError("cannot write ", prefix_, ".bin: ", std::strerror(errno));
  lengths_.push_back(static_cast<int32_t>(tokens.size()));
  numTokens_ += tokens.size();
  return Status::success();
}

Status DatasetWriter::finish() {
  if (finished_ || !bin_) return makeError("internal: ", prefix_, " was already finished");
  std::FILE* bin = std::exchange(bin_, nullptr);
  if (std::fflush(bin) != 0 || std::fclose(bin) != 0) {
    Error e = makeError("cannot write ", prefix_, ".bin: ", std::strerror(errno));
    discard();
    return e;
  }
  const std::string index = indexBytes(dtype_, lengths_);
  Status s = output_.write(prefix_ + ".idx", index);
  // .bin first (it was staged first): a reader that finds the new .idx also finds the .bin it describes.
  if (s.ok()) s = output_.commit();
  if (!s.ok()) {
    discard();
    return s;
  }
  finished_ = true;
  return Status::success();
}

}  // namespace tpc
