// Indexed dataset reader: maps PREFIX.idx/.bin and validates them completely before any access.
#include "frontend/indexed_dataset.h"

#include <limits>

namespace tpc {

size_t tokenDTypeBytes(uint8_t code) {
  switch (static_cast<TokenDType>(code)) {
    case TokenDType::UInt8:
    case TokenDType::Int8: return 1;
    case TokenDType::Int16:
    case TokenDType::UInt16: return 2;
    case TokenDType::Int32:
    case TokenDType::Float32: return 4;
    case TokenDType::Int64:
    case TokenDType::Float64: return 8;
  }
  return 0;
}

const char* tokenDTypeName(uint8_t code) {
  switch (static_cast<TokenDType>(code)) {
    case TokenDType::UInt8: return "uint8";
    case TokenDType::Int8: return "int8";
    case TokenDType::Int16: return "int16";
    case TokenDType::Int32: return "int32";
    case TokenDType::Int64: return "int64";
    case TokenDType::Float64: return "float64";
    case TokenDType::Float32: return "float32";
    case TokenDType::UInt16: return "uint16";
  }
  return "unknown";
}

TokenDType tokenDTypeFor(int64_t vocabSize) { return vocabSize < 65500 ? TokenDType::UInt16 : TokenDType::Int32; }

int64_t TokenSpan::operator[](size_t i) const {
  const uint8_t* p = data_ + i * tokenDTypeBytes(static_cast<uint8_t>(dtype_));
  switch (dtype_) {
    case TokenDType::UInt8: return *p;
    case TokenDType::Int8: return static_cast<int8_t>(*p);
    case TokenDType::Int16: { int16_t v; std::memcpy(&v, p, 2); return v; }
    case TokenDType::UInt16: { uint16_t v; std::memcpy(&v, p, 2); return v; }
    case TokenDType::Int32: { int32_t v; std::memcpy(&v, p, 4); return v; }
    case TokenDType::Int64: { int64_t v; std::memcpy(&v, p, 8); return v; }
    default: return 0;  // float dtypes are refused by IndexedDataset::open
  }
}

void TokenSpan::copyTo(int32_t* out, size_t first, size_t count) const {
  if (dtype_ == TokenDType::UInt16) {  // the common case, kept tight
    const uint8_t* p = data_ + first * 2;
    for (size_t i = 0; i < count; ++i) {
      uint16_t v;
      std::memcpy(&v, p + 2 * i, 2);
      out[i] = v;
    }
    return;
  }
  for (size_t i = 0; i < count; ++i) out[i] = static_cast<int32_t>((*this)[first + i]);
}

TokenSpan TokenSpan::subspan(size_t first, size_t count) const {
  return TokenSpan(data_ + first * tokenDTypeBytes(static_cast<uint8_t>(dtype_)), count, dtype_);
}

Result<IndexedDataset> IndexedDataset::open(const std::string& prefix) {
  IndexedDataset ds;
  ds.prefix_ = prefix;
  const std::string idxPath = prefix + ".idx", binPath = prefix + ".bin";
  TPC_ASSIGN(ds.idx_, MappedFile::open(idxPath));
  TPC_ASSIGN(ds.bin_, MappedFile::open(binPath));
  // A mapping keeps its address when the dataset moves, so these stay valid.
  ds.idxData_ = ds.idx_.data();
  ds.idxSize_ = ds.idx_.size();
  ds.binData_ = ds.bin_.data();
  ds.binSize_ = ds.bin_.size();
  TPC_TRY(ds.validate());
  return ds;
}

Result<IndexedDataset> IndexedDataset::openFromMemory(std::string_view idxBytes, std::string_view binBytes,
                                                      const std::string& prefix) {
  IndexedDataset ds;
  ds.prefix_ = prefix;
  ds.idxData_ = reinterpret_cast<const uint8_t*>(idxBytes.data());
  ds.idxSize_ = idxBytes.size();
  ds.binData_ = reinterpret_cast<const uint8_t*>(binBytes.data());
  ds.binSize_ = binBytes.size();
  TPC_TRY(ds.validate());
  return ds;
}

Status IndexedDataset::validate() {
  const std::string idxPath = prefix_ + ".idx", binPath = prefix_ + ".bin";
  const uint8_t* idx = idxData_;
  const size_t idxSize = idxSize_, binSize = binSize_;
  auto bad = [&](const auto&... why) { return makeError(idxPath, ": ", why...); };

  if (idxSize < kIndexHeaderBytes)
    return bad("truncated: ", idxSize, " bytes, shorter than the ", kIndexHeaderBytes, "-byte header");
  if (std::memcmp(idx, kIndexMagic, sizeof(kIndexMagic)) != 0)
    return bad("not a Megatron indexed dataset index (the file does not start with \"MMIDIDX\\0\\0\")");
  uint64_t version, numSeq, numDoc;
  std::memcpy(&version, idx + 9, 8);
  uint8_t code = idx[17];
  std::memcpy(&numSeq, idx + 18, 8);
  std::memcpy(&numDoc, idx + 26, 8);
  if (version != kIndexVersion) return bad("unsupported version ", version, " (tpc reads version 1)");
  itemBytes_ = tokenDTypeBytes(code);
  if (itemBytes_ == 0) return bad("unknown dtype code ", int(code));
  if (code == uint8_t(TokenDType::Float32) || code == uint8_t(TokenDType::Float64))
    return bad("dtype ", tokenDTypeName(code), " does not hold token ids");
  dtype_ = static_cast<TokenDType>(code);

  // Sizes: compare counts against what the file can hold before multiplying, so nothing overflows.
  const size_t body = idxSize - kIndexHeaderBytes;
  if (numSeq > body / 12 || numDoc > (body - numSeq * 12) / 8)
    return bad("truncated: ", idxSize, " bytes cannot hold ", numSeq, " sequences and ", numDoc, " document indices");
  const size_t expected = kIndexHeaderBytes + numSeq * 12 + numDoc * 8;
  if (idxSize != expected)
    return bad(idxSize - expected, " unexpected bytes after the document index (expected ", expected, " bytes)");
  if (numDoc == 0) return bad("the document index is empty (it starts with 0 even when there are no documents)");
  numSequences_ = numSeq;
  numDocIndex_ = numDoc;
  lengths_ = idx + kIndexHeaderBytes;
  pointers_ = lengths_ + numSeq * 4;
  docIndex_ = pointers_ + numSeq * 8;

  // Sequences lie back to back from offset 0 and fill .bin exactly.
  uint64_t offset = 0;
  const uint64_t maxTokens = std::numeric_limits<uint64_t>::max() / 8;
  for (size_t i = 0; i < numSeq; ++i) {
    int32_t len = load<int32_t>(lengths_, i);
    int64_t ptr = load<int64_t>(pointers_, i);
    if (len < 0) return bad("sequence ", i, " has negative length ", len);
    if (ptr < 0 || static_cast<uint64_t>(ptr) != offset)
      return bad("sequence ", i, " starts at byte ", ptr, " of ", binPath, ", expected ", offset);
    numTokens_ += static_cast<uint64_t>(len);
    if (numTokens_ > maxTokens) return bad("sequence lengths overflow");
    offset += static_cast<uint64_t>(len) * itemBytes_;
    if (offset > binSize)
      return makeError(binPath, ": truncated: ", binSize, " bytes, but ", idxPath, " puts sequence ", i,
                       " at bytes up to ", offset);
  }
  if (offset != binSize)
    return makeError(binPath, ": ", binSize, " bytes, but ", idxPath, " describes ", offset,
                     " bytes of tokens (the two files do not belong together)");
  size_t prev = 0;
  for (size_t i = 0; i < numDoc; ++i) {
    int64_t d = load<int64_t>(docIndex_, i);
    if (i == 0 && d != 0) return bad("the document index starts with ", d, ", not 0");
    if (d < static_cast<int64_t>(prev) || static_cast<uint64_t>(d) > numSeq)
      return bad("document index entry ", i, " = ", d, " is out of order or past the ", numSeq, " sequences");
    prev = static_cast<size_t>(d);
  }
  if (prev != numSeq) return bad("the document index ends at sequence ", prev, ", not at the last (", numSeq, ")");
  return Status::success();
}

Status IndexedDataset::checkTokenRange(int64_t vocabSize) const {
  for (size_t d = 0; d < numDocuments(); ++d) {
    TokenSpan doc = document(d);
    for (size_t i = 0; i < doc.size(); ++i) {
      int64_t id = doc[i];
      if (id < 0 || id >= vocabSize)
        return makeError(prefix_, ".bin: document ", d, " holds token id ", id, ", outside the vocabulary [0, ",
                         vocabSize, ")");
    }
  }
  return Status::success();
}

TokenSpan IndexedDataset::sequence(size_t i) const {
  return TokenSpan(binData_ + pointer(i), sequenceLength(i), dtype_);
}

TokenSpan IndexedDataset::document(size_t i) const {
  size_t first = docIndex(i), last = docIndex(i + 1);
  if (first == last) return TokenSpan(binData_, 0, dtype_);
  uint64_t begin = pointer(first), end = pointer(last - 1) + sequenceLength(last - 1) * itemBytes_;
  return TokenSpan(binData_ + begin, (end - begin) / itemBytes_, dtype_);
}

}  // namespace tpc
