#include "ir/json_text.h"

namespace tpc {

Result<llvm::json::Value> parseJsonText(std::string_view text) {
  int depth = 0;
  bool inString = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (inString) {
      if (c == '\\') ++i;  // the escaped character cannot end the string
      else if (c == '"') inString = false;
    } else if (c == '"') {
      inString = true;
    } else if (c == '[' || c == '{') {
      if (++depth > kMaxJsonNesting)
        return makeError("not JSON: nested deeper than ", kMaxJsonNesting, " levels at byte ", i);
    } else if ((c == ']' || c == '}') && depth > 0) {
      --depth;
    }
  }
  auto v = llvm::json::parse(llvm::StringRef(text.data(), text.size()));
  if (!v) return makeError("not JSON: ", llvm::toString(v.takeError()));
  return std::move(*v);
}

}  // namespace tpc
