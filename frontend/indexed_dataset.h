// Megatron-LM's indexed dataset (MMapIndexedDataset): PREFIX.bin holds every token back to back,
// PREFIX.idx says where each sequence starts and how sequences group into documents. All little-endian:
//   PREFIX.idx: "MMIDIDX\0\0" (9 bytes) | u64 version = 1 | u8 dtype code | u64 sequence count S
//               | u64 document index count D (= documents + 1) | i32 length[S] | i64 byte offset[S]
//               | i64 document index[D] (0, then the end sequence of each document, last = S)
//   PREFIX.bin: the tokens of sequence 0, 1, ... in the dtype, sequence i at byte offset[i].
// IndexedDataset maps both files and checks every count and offset against the file sizes when it opens
// them, so a truncated or crafted file is an error, never a read outside the mapping.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

#include "frontend/mapped_file.h"
#include "ir/status.h"

namespace tpc {

// Megatron's dtype codes (megatron/core/datasets/indexed_dataset.py, DType).
enum class TokenDType : uint8_t { UInt8 = 1, Int8 = 2, Int16 = 3, Int32 = 4, Int64 = 5, Float64 = 6, Float32 = 7, UInt16 = 8 };

inline constexpr char kIndexMagic[9] = {'M', 'M', 'I', 'D', 'I', 'D', 'X', '\0', '\0'};
inline constexpr uint64_t kIndexVersion = 1;
inline constexpr size_t kIndexHeaderBytes = 9 + 8 + 1 + 8 + 8;

// Bytes per element of a dtype code, or 0 for a code that is not one.
size_t tokenDTypeBytes(uint8_t code);
const char* tokenDTypeName(uint8_t code);
// The dtype Megatron picks for a vocabulary: uint16 below 65500 ids, else int32.
TokenDType tokenDTypeFor(int64_t vocabSize);

// The tokens of one sequence or document, in the file's dtype; read as int64.
class TokenSpan {
 public:
  TokenSpan() = default;
  TokenSpan(const uint8_t* data, size_t size, TokenDType dtype) : data_(data), size_(size), dtype_(dtype) {}
  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  TokenDType dtype() const { return dtype_; }
  int64_t operator[](size_t i) const;
  // Copies tokens [first, first + count) to out as int32 (token ids fit).
  void copyTo(int32_t* out, size_t first, size_t count) const;
  TokenSpan subspan(size_t first, size_t count) const;

 private:
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
  TokenDType dtype_ = TokenDType::UInt16;
};

class IndexedDataset {
 public:
  // Opens PREFIX.idx and PREFIX.bin; every error names the file and says what is wrong with it.
  static Result<IndexedDataset> open(const std::string& prefix);
  // The same checks on bytes already in memory (the fuzzer's entry point); the dataset reads the buffers,
  // which must outlive it. `prefix` is only for messages.
  static Result<IndexedDataset> openFromMemory(std::string_view idxBytes, std::string_view binBytes,
                                               const std::string& prefix);

  const std::string& prefix() const { return prefix_; }
  TokenDType dtype() const { return dtype_; }
  size_t numSequences() const { return numSequences_; }
  size_t numDocuments() const { return numDocIndex_ - 1; }
  uint64_t numTokens() const { return numTokens_; }

  size_t sequenceLength(size_t i) const { return static_cast<size_t>(load<int32_t>(lengths_, i)); }
  TokenSpan sequence(size_t i) const;
  // A document's sequences are contiguous in .bin (checked at open), so it is one span.
  TokenSpan document(size_t i) const;
  uint64_t documentLength(size_t i) const { return document(i).size(); }
  // Checks that every token id is in [0, vocabSize) (reads the whole .bin once); the error names the
  // file, the document and the id (the caller adds what to do: it knows the model's tokenizer).
  Status checkTokenRange(int64_t vocabSize) const;

 private:
  // .idx arrays start at unaligned offsets (the header is 34 bytes): read element by element.
  template <class T>
  static T load(const uint8_t* base, size_t i) {
    T v;
    std::memcpy(&v, base + i * sizeof(T), sizeof(T));
    return v;
  }
  uint64_t pointer(size_t i) const { return static_cast<uint64_t>(load<int64_t>(pointers_, i)); }
  size_t docIndex(size_t i) const { return static_cast<size_t>(load<int64_t>(docIndex_, i)); }

  // Validates idxData_/binData_ (already set) and fills in the counts and array pointers.
  Status validate();

  std::string prefix_;
  MappedFile idx_, bin_;  // empty when opened from memory
  const uint8_t* idxData_ = nullptr;
  const uint8_t* binData_ = nullptr;
  size_t idxSize_ = 0, binSize_ = 0;
  TokenDType dtype_ = TokenDType::UInt16;
  size_t itemBytes_ = 2;
  size_t numSequences_ = 0, numDocIndex_ = 1;
  uint64_t numTokens_ = 0;
  const uint8_t* lengths_ = nullptr;
  const uint8_t* pointers_ = nullptr;
  const uint8_t* docIndex_ = nullptr;
};

}  // namespace tpc
