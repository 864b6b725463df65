// Tokenizers: GPT-2 BPE against ids from GPT-2's own encoder.py, the hand-written pre-tokenizer against
// GPT-2's regex, Unicode classes, the byte tokenizer, bad vocabulary files, and `tpc tokenize`.
#include <catch2/catch.hpp>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "frontend/bpe_tokenizer.h"
#include "frontend/byte_tokenizer.h"
#include "frontend/data_dir.h"
#include "frontend/gpt2_pretokenizer.h"
#include "frontend/tokenizer.h"
#include "frontend/unicode_classes.h"
#include "test_support.h"

namespace fs = std::filesystem;
using namespace tpc;
using tpc::test::runCommand;
using tpc::test::sourcePath;
using tpc::test::tpcBinary;

namespace {

std::string gpt2Dir() {
  const char* env = std::getenv("TPC_DATA_DIR");
  return (env && *env ? std::string(env) : sourcePath("data")) + "/gpt2";
}

// The GPT-2 tokenizer, loaded once. Tests that need it fail (never skip) when data/gpt2 is absent.
const BpeTokenizer& gpt2() {
  static Result<std::unique_ptr<BpeTokenizer>> tok =
      BpeTokenizer::load(gpt2Dir() + "/encoder.json", gpt2Dir() + "/vocab.bpe");
  if (!tok.ok())
    FAIL("the GPT-2 vocabulary is missing or broken (" << tok.error()
                                                      << "); run scripts/fetch_data.sh to fetch data/gpt2");
  return **tok;
}

std::vector<int32_t> encode(const Tokenizer& t, const std::string& text) {
  std::vector<int32_t> ids;
  Status s = t.encode(text, ids);
  INFO(text);
  REQUIRE(s.ok());
  return ids;
}

std::string decode(const Tokenizer& t, const std::vector<int32_t>& ids) {
  std::string out;
  REQUIRE(t.decode(ids, out).ok());
  return out;
}


}  // namespace

TEST_CASE("GPT-2 BPE gives GPT-2's ids for known strings", "[tokenizer][gpt2]") {
  const BpeTokenizer& t = gpt2();
  CHECK(t.vocabSize() == 50257);
  CHECK(t.numMerges() == 50000);
  CHECK(t.eod() == 50256);
  // Expected ids computed with OpenAI's gpt-2 encoder.py (regex module) on the same vocabulary.
  CHECK(encode(t, "Hello world") == std::vector<int32_t>{15496, 995});
  CHECK(encode(t, " the") == std::vector<int32_t>{262});
  CHECK(encode(t, "\n") == std::vector<int32_t>{198});
  CHECK(encode(t, "The quick brown fox jumps over the lazy dog.") ==
        std::vector<int32_t>{464, 2068, 7586, 21831, 18045, 625, 262, 16931, 3290, 13});
  CHECK(encode(t, "123 4567 3.14") == std::vector<int32_t>{10163, 4153, 3134, 513, 13, 1415});
  CHECK(encode(t, "x!!!  ?") == std::vector<int32_t>{87, 10185, 220, 5633});
  // "<|endoftext|>" in text is plain text; only the EOD id stands for the end of a document.
  CHECK(encode(t, "<|endoftext|>") == std::vector<int32_t>{27, 91, 437, 1659, 5239, 91, 29});
  CHECK(decode(t, {50256}) == "<|endoftext|>");
  CHECK(t.tokenBytes(262) == " the");
}

TEST_CASE("GPT-2 BPE handles contractions and whitespace runs as GPT-2 does", "[tokenizer][gpt2]") {
  const BpeTokenizer& t = gpt2();
  CHECK(encode(t, "I'm can't we'll they've he'd she's you're") ==
        std::vector<int32_t>{40, 1101, 460, 470, 356, 1183, 484, 1053, 339, 1549, 673, 338, 345, 821});
  CHECK(encode(t, "'S 'T don't") == std::vector<int32_t>{6, 50, 705, 51, 836, 470});
  CHECK(encode(t, "  multiple   spaces\n\n\ttab") == std::vector<int32_t>{220, 3294, 220, 220, 9029, 628, 197, 8658});
  CHECK(encode(t, "line1\nline2\n\n") == std::vector<int32_t>{1370, 16, 198, 1370, 17, 628});
  CHECK(encode(t, "   ") == std::vector<int32_t>{220, 220, 220});
  CHECK(encode(t, "a\u00a0b") == std::vector<int32_t>{64, 1849, 65});
  CHECK(encode(t, "hello\u3000world") == std::vector<int32_t>{31373, 5099, 222, 6894});
}

TEST_CASE("GPT-2 BPE handles Unicode scripts and emoji", "[tokenizer][gpt2]") {
  const BpeTokenizer& t = gpt2();
  CHECK(encode(t, "h\u00e9llo w\u00f6rld") == std::vector<int32_t>{71, 2634, 18798, 266, 30570, 335});
  CHECK(encode(t, "\u65e5\u672c\u8a9e\u306e\u30c6\u30ad\u30b9\u30c8") ==  // 日本語のテキスト
        std::vector<int32_t>{33768, 98, 17312, 105, 45739, 252, 5641, 24336, 25084, 43302});
  CHECK(encode(t, "\u041f\u0440\u0438\u0432\u0435\u0442 \u043c\u0438\u0440") ==  // Привет мир
        std::vector<int32_t>{140, 253, 21169, 18849, 38857, 16843, 20375, 12466, 120, 18849, 21169});
  CHECK(encode(t, "emoji \U0001F600\U0001F44D\U0001F3FD test") ==
        std::vector<int32_t>{368, 31370, 30325, 222, 41840, 235, 8582, 237, 121, 1332});
  CHECK(encode(t, "\U0001F916\U0001F680") == std::vector<int32_t>{8582, 97, 244, 8582, 248, 222});
  CHECK(encode(t, "\U0001F600\U0001F600") == std::vector<int32_t>{47249, 222, 47249, 222});
  CHECK(encode(t, "\u216B\u00BD\u00B2") == std::vector<int32_t>{158, 227, 104, 23141, 31185});  // Ⅻ½² are numbers
  for (const char* s : {"\u00e9\u0301 \u05e2\u05d1\u05e8\u05d9\u05ea \u0939\u093f\u0928\u094d\u0926\u0940",
                        "\U0001F468\u200D\U0001F469\u200D\U0001F467 \U0001F1FA\U0001F1F8", "\x01\x7f\t\r\n"}) {
    std::string text = s;
    CHECK(decode(t, encode(t, text)) == text);
  }
}

TEST_CASE("GPT-2 BPE merges long words like short ones", "[tokenizer][gpt2]") {
  const BpeTokenizer& t = gpt2();
  using S = BpeTokenizer::MergeStrategy;
  // Pieces over 64 bytes take the heap-based merge; ids from GPT-2's encoder.py.
  CHECK(encode(t, std::string(100, 'a')) == std::vector<int32_t>(25, 24794));
  CHECK(encode(t, std::string(80, '=')) == std::vector<int32_t>{23926, 4770});
  std::vector<int32_t> acgt;
  for (int i = 0; i < 25; ++i) acgt.insert(acgt.end(), {2246, 19555});
  std::string acgtText;
  for (int i = 0; i < 25; ++i) acgtText += "ACGT";
  CHECK(encode(t, acgtText) == acgt);
  // Both strategies agree on pieces of every length, random and repetitive.
  uint64_t state = 12345;
  auto rnd = [&] { return (state = state * 6364136223846793005ull + 1442695040888963407ull) >> 33; };
  const std::string alphabet = "etaoinshrdlucmfwypvbgkqjxz";
  for (int n = 1; n <= 300; n += (n < 80 ? 1 : 37)) {
    std::string word;
    for (int i = 0; i < n; ++i) word += alphabet[rnd() % (rnd() % 2 ? 26 : 4)];
    for (const std::string& w : {word, " " + word, std::string(size_t(n), 'l'), std::string(size_t(n), ' ')}) {
      std::vector<int32_t> scan, heap;
      t.encodePiece(w, scan, S::Scan);
      t.encodePiece(w, heap, S::Heap);
      INFO(w);
      CHECK(scan == heap);
      CHECK(decode(t, heap) == w);
    }
  }
}

TEST_CASE("GPT-2 BPE round-trips the whole Brown corpus", "[tokenizer][gpt2][brown]") {
  const BpeTokenizer& t = gpt2();
  std::string path = dataDir() + "/brown/brown.jsonl";
  std::ifstream in(path);
  if (!in) FAIL(path << " is missing; run scripts/fetch_data.sh to fetch the Brown corpus");
  std::string line;
  size_t docs = 0, tokens = 0;
  std::vector<int32_t> ids;
  while (std::getline(in, line)) {
    std::string text = nlohmann::json::parse(line).at("text").get<std::string>();
    ids.clear();
    REQUIRE(t.encode(text, ids).ok());
    std::string back;
    REQUIRE(t.decode(ids, back).ok());
    if (back != text) FAIL("document " << docs << " does not round-trip");
    if (docs == 0)
      CHECK(std::vector<int32_t>(ids.begin(), ids.begin() + 7) ==
            std::vector<int32_t>{464, 44373, 3418, 5675, 48705, 531, 3217});  // The Fulton County Grand Jury said Friday
    ++docs;
    tokens += ids.size();
  }
  CHECK(docs == 500);
  // GPT-2's encoder.py gives 1,303,595 tokens for data/brown/brown.jsonl as scripts/brown_to_jsonl.js writes it.
  CHECK(tokens == 1303595);
}

TEST_CASE("GPT-2 BPE refuses invalid UTF-8 and unknown ids", "[tokenizer][gpt2]") {
  const BpeTokenizer& t = gpt2();
  std::vector<int32_t> ids;
  Status s = t.encode(std::string("ok \xff\xfe"), ids);
  REQUIRE_FALSE(s.ok());
  CHECK_THAT(s.error(), Catch::Contains("UTF-8") && Catch::Contains("byte 3"));
  std::string out;
  Status d = t.decode(std::vector<int32_t>{15496, 50257}, out);
  REQUIRE_FALSE(d.ok());
  CHECK_THAT(d.error(), Catch::Contains("50257"));
  CHECK_FALSE(t.decode(std::vector<int32_t>{-1}, out).ok());
}

TEST_CASE("the pre-tokenizer splits as GPT-2's regex does", "[tokenizer][pretokenizer]") {
  using V = std::vector<std::string_view>;
  // Expected splits computed with regex.findall of GPT-2's pattern.
  CHECK(gpt2Pretokenize("Hello  world\n\n x") == V{"Hello", " ", " world", "\n\n", " x"});
  CHECK(gpt2Pretokenize("I'm  'll's") == V{"I", "'m", " ", " '", "ll", "'s"});
  CHECK(gpt2Pretokenize("a  b   c\t\td ") == V{"a", " ", " b", "  ", " c", "\t", "\t", "d", " "});
  CHECK(gpt2Pretokenize("3.14 +42 ") == V{"3", ".", "14", " +", "42", " "});
  CHECK(gpt2Pretokenize("\u65e5\u672c \u8a9e!?  \U0001F600\U0001F600x") ==
        V{"\u65e5\u672c", " \u8a9e", "!?", " ", " \U0001F600\U0001F600", "x"});
  CHECK(gpt2Pretokenize("x'S'sy") == V{"x", "'", "S", "'s", "y"});
  CHECK(gpt2Pretokenize(" \n a") == V{" \n", " a"});
  CHECK(gpt2Pretokenize("\u00a0\u00a0b") == V{"\u00a0", "\u00a0", "b"});
  CHECK(gpt2Pretokenize("don't!!! ok...") == V{"don", "'t", "!!!", " ok", "..."});
  CHECK(gpt2Pretokenize("").empty());
  // Invalid bytes count as punctuation, and a sequence cut off by the end is never read past it.
  CHECK(gpt2Pretokenize(std::string_view("a\xe6\x97", 3)) == V{"a", "\xe6\x97"});
  CHECK(gpt2Pretokenize(std::string_view("a \xf0", 3)) == V{"a", " \xf0"});
}

TEST_CASE("Unicode classes: letters, numbers, whitespace, everything else", "[tokenizer][unicode]") {
  using unicode::CharClass;
  using unicode::classify;
  for (char32_t c : {U'A', U'z', U'\u00e9', U'\u00df', U'\u03a9', U'\u0416', U'\u05d0', U'\u0627', U'\u0939',
                     U'\u0e01', U'\u65e5', U'\u3042', U'\u30ab', U'\u30fc', U'\uac00', U'\U00020000', U'\u01c5',
                     U'\u02b0', U'\u00aa'})
    CHECK(classify(c) == CharClass::Letter);
  for (char32_t c : {U'0', U'9', U'\u0663', U'\u0967', U'\u216b', U'\u00bd', U'\u00b2', U'\u2460', U'\uff11',
                     U'\U0001D7D8', U'\u3007'})
    CHECK(classify(c) == CharClass::Number);
  for (char32_t c : {U' ', U'\t', U'\n', U'\r', U'\v', U'\f', U'\u0085', U'\u00a0', U'\u1680', U'\u2003',
                     U'\u2028', U'\u2029', U'\u202f', U'\u205f', U'\u3000'})
    CHECK(classify(c) == CharClass::Space);
  // Emoji, symbols, punctuation, marks, format and private-use characters are none of the three.
  for (char32_t c : {U'!', U'\'', U'-', U'\u00a9', U'\u2122', U'\u0301', U'\u200b', U'\u200d', U'\ufeff',
                     U'\U0001F600', U'\U0001F44D', U'\U0001F3FD', U'\U0001F1FA', U'\u2764', U'\ue000',
                     U'\U0010FFFF', U'\x1c'})
    CHECK(classify(c) == CharClass::Other);
}

TEST_CASE("UTF-8 validation rejects malformed sequences", "[tokenizer][unicode]") {
  using unicode::findInvalidUtf8;
  constexpr size_t npos = std::string_view::npos;
  CHECK(findInvalidUtf8("plain ascii text") == npos);
  CHECK(findInvalidUtf8("h\u00e9 \u65e5 \U0001F600") == npos);
  CHECK(findInvalidUtf8("abc\x80") == 3);                           // stray continuation byte
  CHECK(findInvalidUtf8("ab\xc0\x80") == 2);                        // overlong NUL
  CHECK(findInvalidUtf8("\xed\xa0\x80") == 0);                      // a surrogate
  CHECK(findInvalidUtf8("x\xf4\x90\x80\x80") == 1);                 // past U+10FFFF
  CHECK(findInvalidUtf8("0123456789\xe6\x97") == 10);               // cut off at the end
  CHECK(findInvalidUtf8(std::string_view("\0ok", 3)) == npos);      // NUL is valid UTF-8
}

// tpc sample prints a token at a time: a character split over tokens waits for its end, and bytes that are no
// UTF-8 show as U+FFFD (sample wrote them raw: invalid UTF-8 on the terminal).
TEST_CASE("a UTF-8 stream joins characters split over tokens and replaces bytes that are no UTF-8", "[tokenizer][unicode]") {
  unicode::Utf8Stream s;
  CHECK(s.push("h") == "h");
  CHECK(s.push("\xe6") == "");          // the first byte of U+65E5: nothing to show yet
  CHECK(s.push("\x97") == "");
  CHECK(s.push("\xa5!") == "\u65e5!");
  CHECK(s.push("\x80") == "\ufffd");    // a stray continuation byte
  CHECK(s.push("\xc3x") == "\ufffdx");  // a lead byte another character follows
  CHECK(s.push("\xff\xc0\x80") == "\ufffd\ufffd\ufffd");
  // The start of a character another one interrupts is one U+FFFD, as Python's decode(errors="replace") makes it.
  CHECK(s.push("\xe6\x97") == "");
  CHECK(s.push("x") == "\ufffdx");
  // A second byte no well-formed character has (a surrogate, an overlong form) does not wait: each byte is U+FFFD.
  CHECK(s.push("\xed\xa0") == "\ufffd\ufffd");
  CHECK(s.push("\xe0\x80") == "\ufffd\ufffd");
  CHECK(s.push("\xf0\x9f") == "");
  CHECK(s.finish() == "\ufffd");         // cut off by the end of the text: one U+FFFD, as Python's
  CHECK(s.finish() == "");
  std::string all;
  for (char c : std::string("\xf0\x9f\x98\x80 ok")) all += s.push(std::string(1, c));
  CHECK(all == "\U0001F600 ok");
}

TEST_CASE("the byte tokenizer maps bytes to ids 0-255 and EOD to 256", "[tokenizer][byte]") {
  ByteTokenizer t;
  CHECK(t.vocabSize() == 257);
  CHECK(t.eod() == 256);
  CHECK(encode(t, "A\u00e9") == std::vector<int32_t>{65, 0xC3, 0xA9});
  CHECK(decode(t, {72, 105, 256}) == "Hi<|endoftext|>");
  std::string out;
  CHECK_FALSE(t.decode(std::vector<int32_t>{257}, out).ok());
  auto loaded = loadTokenizer("byte");
  REQUIRE(loaded.ok());
  CHECK((*loaded)->name() == "byte");
  auto unknown = loadTokenizer("sentencepiece");
  REQUIRE_FALSE(unknown.ok());
  CHECK_THAT(unknown.error(), Catch::Contains("unknown tokenizer") && Catch::Contains("gpt2"));
}

TEST_CASE("GPT-2's byte-to-unicode map matches encoder.py", "[tokenizer][gpt2]") {
  CHECK(gpt2ByteToUnicode('!') == U'!');
  CHECK(gpt2ByteToUnicode('~') == U'~');
  CHECK(gpt2ByteToUnicode(0) == 0x100);
  CHECK(gpt2ByteToUnicode(' ') == 0x120);  // the "Ġ" of " the" = "Ġthe"
  CHECK(gpt2ByteToUnicode('\n') == 0x10A);
  CHECK(gpt2ByteToUnicode(0xAD) == 0x143);
  CHECK(gpt2ByteToUnicode(0xA1) == 0xA1);
}

TEST_CASE("bad vocabulary files give one clear error naming the file", "[tokenizer][gpt2][errors]") {
  test::TempDir dir;
  const std::string enc = dir / "encoder.json", merges = dir / "vocab.bpe";

  SECTION("missing files") {
    auto r = BpeTokenizer::load(enc, merges);
    REQUIRE_FALSE(r.ok());
    CHECK_THAT(r.error(), Catch::Contains(enc) && Catch::Contains("scripts/fetch_data.sh"));
  }
  // A tiny but complete byte-level vocabulary: the 256 bytes, "ab", EOD; one merge "a b".
  nlohmann::json vocab = nlohmann::json::object();
  auto spelled = [](std::string bytes) {
    std::string s;
    for (unsigned char c : bytes) unicode::appendUtf8(gpt2ByteToUnicode(c), s);
    return s;
  };
  for (int b = 0; b < 256; ++b) vocab[spelled(std::string(1, char(b)))] = b;
  vocab["ab"] = 256;
  vocab["<|endoftext|>"] = 257;

  SECTION("a small valid vocabulary loads and merges") {
    test::writeFile(enc, vocab.dump());
    test::writeFile(merges, "#version: 0.2\na b\n");
    auto r = BpeTokenizer::load(enc, merges);
    REQUIRE(r.ok());
    CHECK(encode(**r, "abc ab") == std::vector<int32_t>{256, 'c', 32, 256});
  }
  SECTION("encoder.json that is not JSON") {
    std::string text = vocab.dump();
    test::writeFile(enc, text.substr(0, text.size() / 2));
    test::writeFile(merges, "#version: 0.2\na b\n");
    auto r = BpeTokenizer::load(enc, merges);
    REQUIRE_FALSE(r.ok());
    CHECK_THAT(r.error(), Catch::Contains(enc) && Catch::Contains("not valid JSON"));
  }
  SECTION("encoder.json with a repeated id") {
    vocab["ab"] = 5;
    test::writeFile(enc, vocab.dump());
    test::writeFile(merges, "#version: 0.2\na b\n");
    auto r = BpeTokenizer::load(enc, merges);
    REQUIRE_FALSE(r.ok());
    CHECK_THAT(r.error(), Catch::Contains(enc));
  }
  SECTION("a merge naming a token that is not in encoder.json") {
    test::writeFile(enc, vocab.dump());
    test::writeFile(merges, "#version: 0.2\na b\nab c\n");
    auto r = BpeTokenizer::load(enc, merges);
    REQUIRE_FALSE(r.ok());
    CHECK_THAT(r.error(), Catch::Contains(merges + ":3:") && Catch::Contains("abc"));
  }
  SECTION("a merge line that is not two tokens") {
    test::writeFile(enc, vocab.dump());
    test::writeFile(merges, "#version: 0.2\na b\nabc\n");
    auto r = BpeTokenizer::load(enc, merges);
    REQUIRE_FALSE(r.ok());
    CHECK_THAT(r.error(), Catch::Contains(merges + ":3:") && Catch::Contains("two tokens"));
  }
  SECTION("an empty vocab.bpe") {
    test::writeFile(enc, vocab.dump());
    test::writeFile(merges, "");
    auto r = BpeTokenizer::load(enc, merges);
    REQUIRE_FALSE(r.ok());
    CHECK_THAT(r.error(), Catch::Contains(merges) && Catch::Contains("no merges"));
  }
}

TEST_CASE("tpc tokenize encodes and decodes on stdin/stdout", "[tokenizer][cli]") {
  gpt2();  // fails clearly when the vocabulary is absent
  auto r = runCommand(tpcBinary() + " tokenize", "Hello world");
  CHECK(r.exitCode == 0);
  CHECK(r.out == "15496 995\n");
  auto d = runCommand(tpcBinary() + " tokenize --decode", "15496 995\n 13\n");
  CHECK(d.exitCode == 0);
  CHECK(d.out == "Hello world.");
  auto b = runCommand(tpcBinary() + " tokenize --tokenizer byte", "Hi");
  CHECK(b.out == "72 105\n");
  auto bd = runCommand(tpcBinary() + " tokenize --tokenizer=byte --decode", "72 105 256");
  CHECK(bd.out == "Hi<|endoftext|>");
  CHECK(runCommand(tpcBinary() + " tokenize --help").exitCode == 0);
}

TEST_CASE("tpc tokenize reports bad input and missing vocabularies", "[tokenizer][cli][errors]") {
  auto bad = runCommand(tpcBinary() + " tokenize", std::string("ok \xff"));
  CHECK(bad.exitCode == 1);
  CHECK_THAT(bad.err, Catch::Contains("UTF-8"));
  auto id = runCommand(tpcBinary() + " tokenize --decode --tokenizer byte", "1 x2");
  CHECK(id.exitCode == 1);
  CHECK_THAT(id.err, Catch::Contains("'x2' is not a token id"));
  test::TempDir empty;
  auto missing = runCommand("TPC_DATA_DIR=" + empty.path.string() + " " + tpcBinary() + " tokenize", "hi");
  CHECK(missing.exitCode == 1);
  CHECK_THAT(missing.err, Catch::Contains(empty.path.string() + "/gpt2/encoder.json") &&
                              Catch::Contains("scripts/fetch_data.sh"));
  // A directory on stdin: one error, nothing on stdout.
  auto dir = runCommand(tpcBinary() + " tokenize --tokenizer byte < " + empty.path.string(), "");
  CHECK(dir.exitCode == 1);
  CHECK(dir.out.empty());
  CHECK_THAT(dir.err, Catch::Contains("stdin is a directory"));
}

TEST_CASE("dataDir follows TPC_DATA_DIR and missing files name the fix", "[tokenizer][data]") {
  const char* old = std::getenv("TPC_DATA_DIR");
  std::string saved = old ? old : "";
  test::TempDir dir;
  setenv("TPC_DATA_DIR", dir.path.c_str(), 1);
  CHECK(dataDir() == dir.path.string());
  auto missing = requireDataFile("gpt2/vocab.bpe", "GPT-2 merges");
  test::writeFile(dir / "present.txt", "x");
  auto present = requireDataFile("present.txt", "a file");
  auto tok = loadTokenizer("gpt2");
  if (old) setenv("TPC_DATA_DIR", saved.c_str(), 1); else unsetenv("TPC_DATA_DIR");
  REQUIRE_FALSE(missing.ok());
  CHECK_THAT(missing.error(), Catch::Contains(dir / "gpt2/vocab.bpe") && Catch::Contains("scripts/fetch_data.sh"));
  REQUIRE(present.ok());
  CHECK(*present == dir / "present.txt");
  REQUIRE_FALSE(tok.ok());
  CHECK_THAT(tok.error(), Catch::Contains(dir / "gpt2/encoder.json"));
  if (!old) CHECK_FALSE(dataDir().empty());
}
