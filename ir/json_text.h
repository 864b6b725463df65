// JSON text from outside (a safetensors header, a checkpoint's state.json, a Hugging Face config.json) parsed
// with llvm::json after a nesting check: llvm::json's parser recurses once per level, so a file of a million
// '[' would overflow the stack. No real file of ours nests more than a few levels.
#pragma once

#include <cmath>
#include <sstream>
#include <string>
#include <string_view>

#include "llvm/Support/JSON.h"

#include "ir/status.h"

namespace tpc {

inline constexpr int kMaxJsonNesting = 256;

// The value, or "not JSON: <llvm's message>" / "not JSON: nested deeper than 256 levels at byte N".
Result<llvm::json::Value> parseJsonText(std::string_view text);

// A number as JSON text, 9 significant digits (a float's round trip); null for a NaN or an infinity, which JSON
// has no words for (Python's json.dumps writes NaN, which json.loads of other languages refuses).
inline std::string jsonNumber(double v) {
  if (!std::isfinite(v)) return "null";
  std::ostringstream o;
  o.precision(9);
  o << v;
  return o.str();
}

}  // namespace tpc
