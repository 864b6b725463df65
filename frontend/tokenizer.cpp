// Tokenizer factory: maps a name to its implementation and its vocabulary files.
#include "frontend/tokenizer.h"

#include "frontend/bpe_tokenizer.h"
#include "frontend/byte_tokenizer.h"
#include "frontend/data_dir.h"

namespace tpc {

std::vector<std::string> tokenizerNames() { return {"gpt2", "byte"}; }

int64_t tokenizerIdCount(std::string_view name) { return name == "byte" ? ByteTokenizer::kEod + 1 : 50257; }

Result<std::unique_ptr<Tokenizer>> loadTokenizer(std::string_view name) {
  if (name == "byte") return std::unique_ptr<Tokenizer>(std::make_unique<ByteTokenizer>());
  if (name == "gpt2") {
    TPC_ASSIGN(std::string encoder, requireDataFile("gpt2/encoder.json", "GPT-2 vocabulary"));
    TPC_ASSIGN(std::string merges, requireDataFile("gpt2/vocab.bpe", "GPT-2 merges"));
    TPC_ASSIGN(auto bpe, BpeTokenizer::load(encoder, merges));
    return std::unique_ptr<Tokenizer>(std::move(bpe));
  }
  return makeError("unknown tokenizer '", name, "' (known: gpt2, byte)");
}

}  // namespace tpc
