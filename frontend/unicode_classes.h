// Unicode as GPT-2's pre-tokenizer sees it: the classes \p{L}, \p{N} and \s of a code point (from a
// sorted range table generated from Python's regex module), and UTF-8 decoding and validation.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace tpc::unicode {

enum class CharClass : uint8_t { Other, Letter, Number, Space };

// The class of a code point; surrogates and values past U+10FFFF are Other.
CharClass classify(char32_t cp);

// Decodes the code point at p (p < end) into cp and returns its length in bytes (1-4), or 0 where the
// bytes are not well-formed UTF-8 (a stray continuation byte, an overlong form, a surrogate, a value past
// U+10FFFF, or a sequence cut off by end).
inline int decodeUtf8(const char* p, const char* end, char32_t& cp) {
  auto b0 = static_cast<unsigned char>(p[0]);
  if (b0 < 0x80) {
    cp = b0;
    return 1;
  }
  int len;
  char32_t min;
  if ((b0 & 0xE0) == 0xC0) {
    len = 2, min = 0x80, cp = b0 & 0x1F;
  } else if ((b0 & 0xF0) == 0xE0) {
    len = 3, min = 0x800, cp = b0 & 0x0F;
  } else if ((b0 & 0xF8) == 0xF0) {
    len = 4, min = 0x10000, cp = b0 & 0x07;
  } else {
    return 0;
  }
  if (end - p < len) return 0;
  for (int i = 1; i < len; ++i) {
    auto b = static_cast<unsigned char>(p[i]);
    if ((b & 0xC0) != 0x80) return 0;
    cp = (cp << 6) | (b & 0x3F);
  }
  if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
  return len;
}

// Offset of the first byte that is not part of well-formed UTF-8, or std::string_view::npos.
size_t findInvalidUtf8(std::string_view text);

// Appends the UTF-8 encoding of cp (a valid scalar value) to out.
void appendUtf8(char32_t cp, std::string& out);

// Bytes decoded a token at a time, shown as valid UTF-8, as Hugging Face's decode (errors="replace") shows them: a
// character a token boundary cuts waits for the next token's bytes; a byte that cannot start or continue one is
// U+FFFD. (A GPT-2 token may hold part of a character; the byte tokenizer's tokens are single bytes.)
class Utf8Stream {
 public:
  std::string push(std::string_view bytes);  // the text that can be shown now
  std::string finish();                      // the rest: a cut character as U+FFFD

 private:
  std::string pending_;
};

}  // namespace tpc::unicode
