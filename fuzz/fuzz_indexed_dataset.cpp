// Fuzzes the indexed-dataset reader (frontend/indexed_dataset.h). Input: u16 little-endian length L, then
// L bytes of .idx, then the .bin bytes. Each file is copied into its own exactly-sized heap buffer, so
// ASan catches a read past either. open must fail or accept a dataset whose every document, sequence and
// token can be read.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string_view>
#include <vector>

#include "frontend/indexed_dataset.h"
#include "fuzz_check.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  size_t idxLen = data[0] | (size_t(data[1]) << 8);
  data += 2;
  size -= 2;
  if (idxLen > size) idxLen = size;
  // new[] of exactly n bytes (not a vector that may keep spare capacity), so any overread is reported.
  std::unique_ptr<char[]> idx(new char[idxLen]), bin(new char[size - idxLen]);
  std::memcpy(idx.get(), data, idxLen);
  std::memcpy(bin.get(), data + idxLen, size - idxLen);
  auto ds = tpc::IndexedDataset::openFromMemory(std::string_view(idx.get(), idxLen),
                                                std::string_view(bin.get(), size - idxLen), "fuzz");
  if (!ds) return 0;

  uint64_t total = 0, sum = 0;
  for (size_t i = 0; i < ds->numSequences(); ++i) {
    tpc::TokenSpan s = ds->sequence(i);
    FUZZ_CHECK(s.size() == ds->sequenceLength(i), "sequence length");
    for (size_t j = 0; j < s.size(); ++j) sum += static_cast<uint64_t>(s[j]);
    total += s.size();
  }
  FUZZ_CHECK(total == ds->numTokens(), "sequence lengths do not add up to numTokens");
  uint64_t docTotal = 0;
  std::vector<int32_t> buf;
  for (size_t d = 0; d < ds->numDocuments(); ++d) {
    tpc::TokenSpan doc = ds->document(d);
    buf.resize(doc.size());
    if (!doc.empty()) doc.copyTo(buf.data(), 0, doc.size());
    if (doc.size() > 1) {
      tpc::TokenSpan tail = doc.subspan(1, doc.size() - 1);
      FUZZ_CHECK(tail[tail.size() - 1] == doc[doc.size() - 1], "subspan");
    }
    docTotal += doc.size();
  }
  FUZZ_CHECK(docTotal == ds->numTokens(), "documents do not cover the tokens exactly once");
  (void)ds->checkTokenRange(1 << 16);
  volatile uint64_t sink = sum;  // keeps the token reads from being optimised away
  (void)sink;
  return 0;
}
