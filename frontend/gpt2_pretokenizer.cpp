// GPT-2 pre-tokenizer: one left-to-right scan that tries the pattern's alternatives in order.
#include "frontend/gpt2_pretokenizer.h"

#include "frontend/unicode_classes.h"

namespace tpc {
namespace {

using unicode::CharClass;

// One decoded code point: its class and its length in bytes (an invalid byte is Other of length 1).
struct Char {
  CharClass cls;
  int len;
  char32_t cp;
};

inline Char charAt(const char* p, const char* end) {
  auto b = static_cast<unsigned char>(*p);
  if (b < 0x80) return {unicode::classify(b), 1, b};
  char32_t cp;
  int n = unicode::decodeUtf8(p, end, cp);
  if (n == 0) return {CharClass::Other, 1, 0xFFFD};
  return {unicode::classify(cp), n, cp};
}

// Length of the contraction ('s 't 're 've 'm 'll 'd, lower case only) starting at p, or 0.
inline size_t contractionLength(const char* p, const char* end) {
  if (end - p < 2 || p[0] != '\'') return 0;
  char c = p[1];
  if (c == 's' || c == 't' || c == 'm' || c == 'd') return 2;
  if (end - p < 3) return 0;
  char d = p[2];
  if ((c == 'r' && d == 'e') || (c == 'v' && d == 'e') || (c == 'l' && d == 'l')) return 3;
  return 0;
}

// End of the run of characters of class cls that starts at p.
inline const char* runEnd(const char* p, const char* end, CharClass cls) {
  while (p < end) {
    Char c = charAt(p, end);
    if (c.cls != cls) break;
    p += c.len;
  }
  return p;
}

}  // namespace

bool Gpt2Pretokenizer::next(std::string_view& piece) {
  const char* begin = text_.data();
  const char* end = begin + text_.size();
  const char* p = begin + pos_;
  if (p >= end) return false;
  const char* stop;

  if (size_t n = contractionLength(p, end)) {
    stop = p + n;  // 's|'t|'re|'ve|'m|'ll|'d
  } else {
    Char c = charAt(p, end);
    // " ?X+" for X in {\p{L}, \p{N}, [^\s\p{L}\p{N}]}: an optional single space, then a run of one class.
    const char* body = p;
    if (*p == ' ' && p + 1 < end) {
      Char after = charAt(p + 1, end);
      if (after.cls != CharClass::Space) body = p + 1, c = after;
    }
    if (c.cls != CharClass::Space) {
      stop = runEnd(body + c.len, end, c.cls);
    } else {
      // \s+(?!\S): a whitespace run that reaches the end of the text or leaves its last character for
      // the next piece (so " word" keeps its space); \s+ when the run is a single character.
      const char* q = p;
      const char* last = p;
      while (q < end) {
        Char w = charAt(q, end);
        if (w.cls != CharClass::Space) break;
        last = q;
        q += w.len;
      }
      stop = (q == end || last == p) ? q : last;
    }
  }
  piece = std::string_view(p, static_cast<size_t>(stop - p));
  pos_ = static_cast<size_t>(stop - begin);
  return true;
}

std::vector<std::string_view> gpt2Pretokenize(std::string_view text) {
  std::vector<std::string_view> out;
  Gpt2Pretokenizer pre(text);
  std::string_view piece;
  while (pre.next(piece)) out.push_back(piece);
  return out;
}

}  // namespace tpc
