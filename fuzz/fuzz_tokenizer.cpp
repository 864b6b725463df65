// Fuzzes the tokenizers. GPT-2 BPE: valid UTF-8 encodes to in-vocabulary ids that decode to exactly the
// input; invalid UTF-8 is an error; the two merge strategies agree; decoding arbitrary ids never reads
// outside the vocabulary. Byte tokenizer: any bytes round-trip. Needs $TPC_DATA_DIR/gpt2.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "frontend/bpe_tokenizer.h"
#include "frontend/byte_tokenizer.h"
#include "frontend/data_dir.h"
#include "frontend/unicode_classes.h"
#include "fuzz_check.h"

namespace {

std::unique_ptr<tpc::BpeTokenizer> gpt2;

std::string hex(std::string_view s) {
  static const char* d = "0123456789abcdef";
  std::string out;
  for (unsigned char c : s) (out += d[c >> 4]) += d[c & 15];
  return out;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  std::string dir = tpc::dataDir() + "/gpt2";
  auto t = tpc::BpeTokenizer::load(dir + "/encoder.json", dir + "/vocab.bpe");
  if (!t) {
    std::fprintf(stderr, "fuzz_tokenizer: %s (set TPC_DATA_DIR to the folder holding gpt2/)\n", t.error().c_str());
    std::exit(2);
  }
  gpt2 = std::move(*t);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view text(reinterpret_cast<const char*>(data), size);

  tpc::ByteTokenizer bytes;
  std::vector<int32_t> ids;
  FUZZ_CHECK(bytes.encode(text, ids).ok(), "byte encode failed");
  std::string back;
  FUZZ_CHECK(bytes.decode(ids, back).ok() && back == text, "byte tokenizer round trip: " + hex(text));

  ids.clear();
  tpc::Status s = gpt2->encode(text, ids);
  if (tpc::unicode::findInvalidUtf8(text) == std::string_view::npos) {
    FUZZ_CHECK(s.ok(), "valid UTF-8 did not encode: " + (s.ok() ? std::string() : s.error()) + " " + hex(text));
    for (int32_t id : ids) FUZZ_CHECK(id >= 0 && id < gpt2->vocabSize(), "id out of range: " + std::to_string(id));
    back.clear();
    FUZZ_CHECK(gpt2->decode(ids, back).ok(), "decode of encoded ids failed");
    FUZZ_CHECK(back == text, "GPT-2 round trip: " + hex(text) + " -> " + hex(back));
  } else {
    FUZZ_CHECK(!s.ok(), "invalid UTF-8 was accepted: " + hex(text));
  }

  // Scan and Heap merging must give the same ids (Auto picks by length; force both on any bytes).
  if (size <= 512) {
    std::vector<int32_t> scan, heap;
    gpt2->encodePiece(text, scan, tpc::BpeTokenizer::MergeStrategy::Scan);
    gpt2->encodePiece(text, heap, tpc::BpeTokenizer::MergeStrategy::Heap);
    FUZZ_CHECK(scan == heap, "Scan and Heap merges differ on " + hex(text));
  }

  // The bytes as ids (any int32, most outside the vocabulary): an error or in-vocabulary bytes.
  std::vector<int32_t> raw(size / 4);
  if (!raw.empty()) std::memcpy(raw.data(), data, raw.size() * 4);
  back.clear();
  (void)gpt2->decode(raw, back);
  back.clear();
  (void)bytes.decode(raw, back);
  return 0;
}
