// GPT-2 byte-level BPE: vocabulary loading, merging by rank, and the per-thread pre-token cache.
#include "frontend/bpe_tokenizer.h"

#include <algorithm>
#include <atomic>
#include <fstream>
#include <queue>
#include <sstream>

#include <nlohmann/json.hpp>

#include "frontend/gpt2_pretokenizer.h"
#include "frontend/unicode_classes.h"

namespace tpc {

char32_t gpt2ByteToUnicode(uint8_t b) {
  static const auto table = [] {
    std::array<char32_t, 256> t{};
    char32_t next = 256;
    for (int c = 0; c < 256; ++c) {
      bool printable = (c >= '!' && c <= '~') || (c >= 0xA1 && c <= 0xAC) || (c >= 0xAE && c <= 0xFF);
      t[c] = printable ? static_cast<char32_t>(c) : next++;
    }
    return t;
  }();
  return table[b];
}

namespace {

// Inverse of gpt2ByteToUnicode: code points 0..323 -> byte, or -1.
const std::array<int, 324>& unicodeToByte() {
  static const auto table = [] {
    std::array<int, 324> t;
    t.fill(-1);
    for (int b = 0; b < 256; ++b) t[gpt2ByteToUnicode(static_cast<uint8_t>(b))] = b;
    return t;
  }();
  return table;
}

// Maps a token as spelled in encoder.json / vocab.bpe back to its raw bytes; false if a character is
// not in the byte-to-unicode alphabet.
bool spelledToBytes(std::string_view spelled, std::string& bytes) {
  bytes.clear();
  const char* p = spelled.data();
  const char* end = p + spelled.size();
  while (p < end) {
    char32_t cp;
    int n = unicode::decodeUtf8(p, end, cp);
    if (n == 0 || cp >= 324 || unicodeToByte()[cp] < 0) return false;
    bytes += static_cast<char>(unicodeToByte()[cp]);
    p += n;
  }
  return true;
}

Result<std::string> readWholeFile(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return makeError("cannot open ", path, "; run scripts/fetch_data.sh to download the GPT-2 vocabulary");
  std::ostringstream ss;
  ss << f.rdbuf();
  if (f.bad()) return makeError("cannot read ", path);
  return ss.str();
}

std::atomic<uint64_t> gNextInstance{1};

}  // namespace

// (left id, right id) -> (rank, merged id): open addressing, sized for a load factor under 1/2.
struct BpeTokenizer::MergeTable {
  static constexpr uint64_t kEmpty = ~0ull;
  std::vector<uint64_t> keys, values;
  uint64_t mask = 0;

  explicit MergeTable(size_t n) {
    size_t cap = 16;
    while (cap < 2 * n + 2) cap <<= 1;
    keys.assign(cap, kEmpty);
    values.assign(cap, 0);
    mask = cap - 1;
  }
  static uint64_t key(int32_t a, int32_t b) { return (uint64_t(uint32_t(a)) << 32) | uint32_t(b); }
  size_t slot(uint64_t k) const { return (k * 0x9E3779B97F4A7C15ull) >> 17 & mask; }
  void insert(int32_t a, int32_t b, uint32_t rank, int32_t merged) {
    uint64_t k = key(a, b);
    size_t i = slot(k);
    while (keys[i] != kEmpty && keys[i] != k) i = (i + 1) & mask;
    keys[i] = k;  // a repeated merge line takes the later rank, as Python's dict(zip(merges, ranks)) does
    values[i] = (uint64_t(rank) << 32) | uint32_t(merged);
  }
  // Returns rank << 32 | merged id, or kEmpty.
  uint64_t find(int32_t a, int32_t b) const {
    uint64_t k = key(a, b);
    for (size_t i = slot(k);; i = (i + 1) & mask) {
      if (keys[i] == k) return values[i];
      if (keys[i] == kEmpty) return kEmpty;
    }
  }
};

Result<std::unique_ptr<BpeTokenizer>> BpeTokenizer::load(const std::string& encoderJsonPath,
                                                          const std::string& mergesPath) {
  std::unique_ptr<BpeTokenizer> t(new BpeTokenizer());
  t->instance_ = gNextInstance.fetch_add(1);

  // encoder.json: {"<token spelled in the byte alphabet>": id, ...} with ids 0..N-1.
  TPC_ASSIGN(std::string encoderText, readWholeFile(encoderJsonPath));
  nlohmann::json encoder;
  try {
    encoder = nlohmann::json::parse(encoderText);
  } catch (const nlohmann::json::parse_error& e) {
    return makeError(encoderJsonPath, ": not valid JSON (byte ", e.byte,
                     "); delete it and run scripts/fetch_data.sh again");
  }
  if (!encoder.is_object() || encoder.empty())
    return makeError(encoderJsonPath, ": expected a JSON object mapping tokens to ids");
  size_t n = encoder.size();
  t->tokens_.assign(n, std::string());
  std::vector<bool> seen(n, false);
  std::string bytes;
  for (auto it = encoder.begin(); it != encoder.end(); ++it) {
    if (!it.value().is_number_integer())
      return makeError(encoderJsonPath, ": the id of token \"", it.key(), "\" is not an integer");
    long long id = it.value().get<long long>();
    if (id < 0 || id >= static_cast<long long>(n))
      return makeError(encoderJsonPath, ": token \"", it.key(), "\" has id ", id, ", outside [0, ", n, ")");
    if (seen[id]) return makeError(encoderJsonPath, ": id ", id, " is given to two tokens");
    seen[id] = true;
    if (it.key() == "<|endoftext|>") {
      bytes = it.key();
      t->eod_ = static_cast<int32_t>(id);
    } else if (!spelledToBytes(it.key(), bytes) || bytes.empty()) {
      return makeError(encoderJsonPath, ": token \"", it.key(), "\" is not spelled in GPT-2's byte alphabet");
    }
    t->tokens_[id] = bytes;
    t->ids_.emplace(bytes, static_cast<int32_t>(id));
  }
  if (t->eod_ < 0) return makeError(encoderJsonPath, ": no \"<|endoftext|>\" token");
  for (int b = 0; b < 256; ++b) {
    int32_t id = t->tokenId(std::string(1, static_cast<char>(b)));
    if (id < 0) return makeError(encoderJsonPath, ": no token for byte ", b, " (a byte-level vocabulary has all 256)");
    t->byteIds_[b] = id;
  }

  // vocab.bpe: "#version: ..." then one merge "left right" per line, highest priority first.
  TPC_ASSIGN(std::string mergesText, readWholeFile(mergesPath));
  std::vector<std::pair<int32_t, int32_t>> pairs;
  std::vector<int32_t> merged;
  size_t lineNo = 0, pos = 0;
  std::string left, right;
  while (pos < mergesText.size()) {
    size_t eol = mergesText.find('\n', pos);
    if (eol == std::string::npos) eol = mergesText.size();
    std::string_view line(mergesText.data() + pos, eol - pos);
    pos = eol + 1;
    ++lineNo;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.empty() || (lineNo == 1 && line.starts_with("#version"))) continue;
    size_t space = line.find(' ');
    if (space == 0 || space == std::string_view::npos || space + 1 == line.size() ||
        line.find(' ', space + 1) != std::string_view::npos)
      return makeError(mergesPath, ":", lineNo, ": expected two tokens separated by one space, got \"", line, "\"");
    std::string_view a = line.substr(0, space), b = line.substr(space + 1);
    if (!spelledToBytes(a, left) || !spelledToBytes(b, right))
      return makeError(mergesPath, ":", lineNo, ": \"", line, "\" is not spelled in GPT-2's byte alphabet");
    int32_t ia = t->tokenId(left), ib = t->tokenId(right), im = t->tokenId(left + right);
    if (ia < 0 || ib < 0 || im < 0) {
      std::string missing(ia < 0 ? a : ib < 0 ? b : std::string_view());
      if (missing.empty()) missing = std::string(a) + std::string(b);
      return makeError(mergesPath, ":", lineNo, ": merge \"", line, "\" uses \"", missing,
                       "\", which is not in ", encoderJsonPath, " (the two files do not belong together)");
    }
    pairs.emplace_back(ia, ib);
    merged.push_back(im);
  }
  if (pairs.empty()) return makeError(mergesPath, ": no merges (an empty or truncated vocab.bpe)");
  auto table = std::make_shared<MergeTable>(pairs.size());
  for (size_t r = 0; r < pairs.size(); ++r)
    table->insert(pairs[r].first, pairs[r].second, static_cast<uint32_t>(r), merged[r]);
  t->merges_ = std::move(table);
  t->numMerges_ = pairs.size();
  return t;
}

int32_t BpeTokenizer::tokenId(std::string_view bytes) const {
  auto it = ids_.find(std::string(bytes));
  return it == ids_.end() ? -1 : it->second;
}

// Short words: repeatedly merge the leftmost pair of lowest rank. Merging one occurrence at a time gives
// what GPT-2's merge-every-occurrence loop gives: a pair made by a merge always ranks after that merge.
void BpeTokenizer::mergeShort(std::vector<int32_t>& sym) const {
  const MergeTable& m = *merges_;
  while (sym.size() > 1) {
    uint64_t best = MergeTable::kEmpty;
    size_t at = 0;
    for (size_t i = 0; i + 1 < sym.size(); ++i) {
      uint64_t v = m.find(sym[i], sym[i + 1]);
      if ((v >> 32) < (best >> 32)) best = v, at = i;
    }
    if (best == MergeTable::kEmpty) break;
    sym[at] = static_cast<int32_t>(best & 0xFFFFFFFFu);
    sym.erase(sym.begin() + static_cast<std::ptrdiff_t>(at) + 1);
  }
}

struct BpeTokenizer::Candidate {
  uint32_t rank, pos;
  int32_t left, right;
  bool operator>(const Candidate& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
};

// Long words (a run of thousands of letters): the same merges in O(n log n), with a linked list of
// symbols and a heap of candidate pairs ordered by (rank, position); stale candidates are skipped.
void BpeTokenizer::mergeLong(std::vector<int32_t>& sym) const {
  const MergeTable& m = *merges_;
  const int n = static_cast<int>(sym.size());
  std::vector<int> next(n), prev(n);
  for (int i = 0; i < n; ++i) next[i] = i + 1 < n ? i + 1 : -1, prev[i] = i - 1;
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> heap;
  auto push = [&](int i) {
    if (i < 0 || next[i] < 0) return;
    uint64_t v = m.find(sym[i], sym[next[i]]);
    if (v != MergeTable::kEmpty) heap.push({uint32_t(v >> 32), uint32_t(i), sym[i], sym[next[i]]});
  };
  for (int i = 0; i + 1 < n; ++i) push(i);
  while (!heap.empty()) {
    Candidate c = heap.top();
    heap.pop();
    int i = static_cast<int>(c.pos), j = next[i];
    if (sym[i] != c.left || j < 0 || sym[j] != c.right) continue;
    sym[i] = static_cast<int32_t>(m.find(c.left, c.right) & 0xFFFFFFFFu);
    sym[j] = -1;
    next[i] = next[j];
    if (next[j] >= 0) prev[next[j]] = i;
    push(prev[i]);
    push(i);
  }
  size_t k = 0;
  for (int i = 0; i >= 0 && i < n; i = next[i]) sym[k++] = sym[i];
  sym.resize(k);
}

void BpeTokenizer::encodePiece(std::string_view piece, std::vector<int32_t>& out, MergeStrategy strategy) const {
  thread_local std::vector<int32_t> sym;
  sym.clear();
  for (char c : piece) sym.push_back(byteIds_[static_cast<unsigned char>(c)]);
  if (strategy == MergeStrategy::Scan || (strategy == MergeStrategy::Auto && sym.size() <= 64)) {
    mergeShort(sym);
  } else {
    mergeLong(sym);
  }
  out.insert(out.end(), sym.begin(), sym.end());
}

namespace {

struct StringViewHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>()(s); }
};

// Per-thread BPE results of recent pre-tokens, for one tokenizer instance at a time.
struct PieceCache {
  static constexpr size_t kMaxEntries = 1 << 18, kMaxPieceBytes = 128;
  uint64_t owner = 0;
  std::unordered_map<std::string, std::pair<uint32_t, uint32_t>, StringViewHash, std::equal_to<>> spans;
  std::vector<int32_t> ids;
  void reset(uint64_t newOwner) {
    owner = newOwner;
    spans.clear();
    ids.clear();
  }
};

}  // namespace

Status BpeTokenizer::encode(std::string_view text, std::vector<int32_t>& out) const {
  if (size_t bad = unicode::findInvalidUtf8(text); bad != std::string_view::npos)
    return makeError("the text is not valid UTF-8 (byte ", bad, ")");
  thread_local PieceCache cache;
  if (cache.owner != instance_ || cache.spans.size() >= PieceCache::kMaxEntries) cache.reset(instance_);
  Gpt2Pretokenizer pre(text);
  std::string_view piece;
  while (pre.next(piece)) {
    if (piece.size() == 1) {
      out.push_back(byteIds_[static_cast<unsigned char>(piece[0])]);
      continue;
    }
    if (piece.size() > PieceCache::kMaxPieceBytes) {
      encodePiece(piece, out);
      continue;
    }
    auto it = cache.spans.find(piece);
    if (it == cache.spans.end()) {
      size_t start = cache.ids.size();
      encodePiece(piece, cache.ids);
      it = cache.spans.emplace(std::string(piece), std::make_pair(uint32_t(start), uint32_t(cache.ids.size() - start))).first;
    }
    const int32_t* ids = cache.ids.data() + it->second.first;
    out.insert(out.end(), ids, ids + it->second.second);
  }
  return Status::success();
}

Status BpeTokenizer::decode(std::span<const int32_t> ids, std::string& out) const {
  for (int32_t id : ids) {
    if (id < 0 || id >= vocabSize())
      return makeError("token id ", id, " is outside the GPT-2 vocabulary [0, ", vocabSize(), ")");
    out += tokens_[id];
  }
  return Status::success();
}

}  // namespace tpc
