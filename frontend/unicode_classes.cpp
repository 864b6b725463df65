// Unicode classes for the GPT-2 pre-tokenizer: a binary search over generated code point ranges.
#include "frontend/unicode_classes.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <string>

namespace tpc::unicode {
namespace {

struct Range {
  char32_t first, last;
  CharClass cls;
};

constexpr CharClass L = CharClass::Letter, N = CharClass::Number, S = CharClass::Space;

constexpr Range kRanges[] = {
#include "frontend/unicode_class_ranges.inc"
};

constexpr bool sortedAndDisjoint() {
  for (size_t i = 1; i < std::size(kRanges); ++i)
    if (kRanges[i - 1].last >= kRanges[i].first || kRanges[i].first > kRanges[i].last) return false;
  return true;
}
static_assert(sortedAndDisjoint(), "unicode_class_ranges.inc must be sorted and disjoint");

// Code points below 0x100 (ASCII and Latin-1) are most of any English text: one table look-up.
constexpr std::array<CharClass, 256> makeLatin1() {
  std::array<CharClass, 256> t{};
  for (const Range& r : kRanges)
    for (char32_t c = r.first; c <= r.last && c < 256; ++c) t[c] = r.cls;
  return t;
}
constexpr std::array<CharClass, 256> kLatin1 = makeLatin1();

}  // namespace

CharClass classify(char32_t cp) {
  if (cp < 256) return kLatin1[cp];
  const Range* end = std::end(kRanges);
  const Range* it = std::upper_bound(std::begin(kRanges), end, cp,
                                     [](char32_t c, const Range& r) { return c < r.first; });
  if (it == std::begin(kRanges)) return CharClass::Other;
  --it;
  return cp <= it->last ? it->cls : CharClass::Other;
}

size_t findInvalidUtf8(std::string_view text) {
  const char* p = text.data();
  const char* end = p + text.size();
  while (p < end) {
    // Skip ASCII eight bytes at a time.
    while (end - p >= 8) {
      uint64_t w;
      std::memcpy(&w, p, 8);
      if (w & 0x8080808080808080ull) break;
      p += 8;
    }
    if (p >= end) break;
    char32_t cp;
    int n = decodeUtf8(p, end, cp);
    if (n == 0) return static_cast<size_t>(p - text.data());
    p += n;
  }
  return std::string_view::npos;
}

void appendUtf8(char32_t cp, std::string& out) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

namespace {

constexpr std::string_view kReplacement = "\xEF\xBF\xBD";  // U+FFFD

// The length of the sequence lead byte b starts (2-4), or 0 for a byte no well-formed sequence starts with.
int leadLength(unsigned char b) {
  if (b >= 0xC2 && b <= 0xDF) return 2;
  if (b >= 0xE0 && b <= 0xEF) return 3;
  if (b >= 0xF0 && b <= 0xF4) return 4;
  return 0;
}

}  // namespace

std::string Utf8Stream::push(std::string_view bytes) {
  pending_.append(bytes);
  std::string out;
  const char* p = pending_.data();
  const char* end = p + pending_.size();
  while (p < end) {
    char32_t cp;
    if (int len = decodeUtf8(p, end, cp); len > 0) {
      out.append(p, static_cast<size_t>(len));
      p += len;
      continue;
    }
    // As Python's decode(errors="replace"): the longest start of a well-formed character here (a lead byte and the
    // continuation bytes that may follow it) is one U+FFFD, or waits for the next token's bytes where the text ends.
    const auto b0 = static_cast<unsigned char>(*p);
    const int want = leadLength(b0);
    int k = 0;  // continuation bytes after the lead that fit
    while (want > 0 && k < want - 1 && p + 1 + k < end) {
      const auto b = static_cast<unsigned char>(p[1 + k]);
      // The second byte's range excludes overlong forms, surrogates and values past U+10FFFF.
      const unsigned char lo = k > 0 ? 0x80 : b0 == 0xE0 ? 0xA0 : b0 == 0xF0 ? 0x90 : 0x80;
      const unsigned char hi = k > 0 ? 0xBF : b0 == 0xED ? 0x9F : b0 == 0xF4 ? 0x8F : 0xBF;
      if (b < lo || b > hi) break;
      ++k;
    }
    if (want > 0 && p + 1 + k == end) break;  // cut by the end of what came so far
    out.append(kReplacement);
    p += 1 + k;
  }
  pending_.erase(0, static_cast<size_t>(p - pending_.data()));
  return out;
}

std::string Utf8Stream::finish() {
  std::string out = pending_.empty() ? "" : std::string(kReplacement);
  pending_.clear();
  return out;
}

}  // namespace tpc::unicode
