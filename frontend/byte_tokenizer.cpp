// Byte-level tokenizer: the identity on bytes, plus one end-of-document id.
#include "frontend/byte_tokenizer.h"

namespace tpc {

const std::string& ByteTokenizer::name() const {
  static const std::string kName = "byte";
  return kName;
}

Status ByteTokenizer::encode(std::string_view text, std::vector<int32_t>& out) const {
  size_t at = out.size();
  out.resize(at + text.size());  // resize grows geometrically; an exact reserve per call would not
  for (size_t i = 0; i < text.size(); ++i) out[at + i] = static_cast<unsigned char>(text[i]);
  return Status::success();
}

Status ByteTokenizer::decode(std::span<const int32_t> ids, std::string& out) const {
  for (int32_t id : ids) {
    if (id == kEod) {
      out += "<|endoftext|>";
    } else if (id >= 0 && id < 256) {
      out += static_cast<char>(id);
    } else {
      return makeError("token id ", id, " is outside the byte tokenizer's vocabulary [0, 257)");
    }
  }
  return Status::success();
}

}  // namespace tpc
