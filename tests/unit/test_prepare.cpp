// `tpc prepare` end to end through the binary: outputs, determinism across workers, and every bad input
// giving one clear error with the file and line, exit 1, and no output left behind.
#include <catch2/catch.hpp>

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "frontend/bpe_tokenizer.h"
#include "frontend/prepare.h"
#include "frontend/tokenizer.h"
#include "frontend/indexed_dataset.h"
#include "frontend/data_dir.h"
#include "ir/file_io.h"
#include "test_support.h"

namespace fs = std::filesystem;
using namespace tpc;
using tpc::test::readFile;
using tpc::test::runCommand;
using tpc::test::sourcePath;
using tpc::test::tpcBinary;

namespace {


std::vector<int32_t> tokensOf(const TokenSpan& s) {
  std::vector<int32_t> v(s.size());
  s.copyTo(v.data(), 0, s.size());
  return v;
}

std::vector<int32_t> bytesPlusEod(const std::string& s) {
  std::vector<int32_t> v(s.begin(), s.end());
  for (auto& x : v) x &= 0xFF;
  v.push_back(256);
  return v;
}

// Every file beside PREFIX whose name starts "PREFIX." (its .bin and .idx, and any temporary of theirs).
std::vector<std::string> filesOf(const std::string& prefix) {
  std::vector<std::string> names;
  const fs::path p(prefix);
  const std::string start = p.filename().string() + ".";
  for (const auto& e : fs::directory_iterator(p.parent_path()))
    if (std::string n = e.path().filename().string(); n.rfind(start, 0) == 0) names.push_back(n);
  std::sort(names.begin(), names.end());
  return names;
}

tpc::test::CommandResult prepare(const std::string& flags) {
  return runCommand(tpcBinary() + " prepare --quiet " + flags);
}

// The error contract: exit 1, the message on stderr, and no PREFIX.* file of any kind.
void expectFailure(const tpc::test::CommandResult& r, const std::string& prefix, const std::vector<std::string>& parts) {
  INFO(r.err);
  CHECK(r.exitCode == 1);
  CHECK_THAT(r.err, Catch::StartsWith("tpc prepare: error: "));
  for (const std::string& p : parts) CHECK_THAT(r.err, Catch::Contains(p));
  if (fs::exists(fs::path(prefix).parent_path())) CHECK(filesOf(prefix).empty());
}

}  // namespace

TEST_CASE("tpc prepare turns text lines into documents", "[prepare][cli]") {
  test::TempDir dir;
  // Blank lines, spaces and tabs alone among them, are no documents; a line's own spaces stay.
  test::writeFile(dir / "in.txt", "first line\n\n   \n\t \r\nsecond \xc3\xa9\r\nthird");
  auto r = prepare("--input " + (dir / "in.txt") + " --tokenizer byte --append-eod --output-prefix " + (dir / "out"));
  INFO(r.err);
  REQUIRE(r.exitCode == 0);
  auto ds = IndexedDataset::open(dir / "out");
  REQUIRE(ds.ok());
  REQUIRE(ds->numDocuments() == 3);
  CHECK(ds->dtype() == TokenDType::UInt16);
  CHECK(tokensOf(ds->document(0)) == bytesPlusEod("first line"));
  CHECK(tokensOf(ds->document(1)) == bytesPlusEod("second \xc3\xa9"));
  CHECK(tokensOf(ds->document(2)) == bytesPlusEod("third"));
  CHECK(filesOf(dir / "out") == std::vector<std::string>{"out.bin", "out.idx"});
}

TEST_CASE("tpc prepare skips a byte order mark at the start of the file", "[prepare][cli]") {
  test::TempDir dir;
  // Windows editors start UTF-8 text with EF BB BF: the first document was those three bytes and then its text.
  test::writeFile(dir / "bom.txt", "\xEF\xBB\xBFhello\r\nworld\r\n");
  test::writeFile(dir / "bom.jsonl", "\xEF\xBB\xBF{\"text\": \"hello\"}\r\n{\"text\": \"world\"}\r\n");
  for (const char* input : {"bom.txt", "bom.jsonl"}) {
    auto r = prepare("--input " + (dir / input) + " --tokenizer byte --output-prefix " + (dir / "out"));
    INFO(input << ": " << r.err);
    REQUIRE(r.exitCode == 0);
    auto ds = IndexedDataset::open(dir / "out");
    REQUIRE(ds.ok());
    REQUIRE(ds->numDocuments() == 2);
    CHECK(tokensOf(ds->document(0)) == std::vector<int32_t>{'h', 'e', 'l', 'l', 'o'});
    CHECK(tokensOf(ds->document(1)) == std::vector<int32_t>{'w', 'o', 'r', 'l', 'd'});
  }
}

TEST_CASE("tpc prepare reads JSONL with a chosen key", "[prepare][cli]") {
  test::TempDir dir;
  test::writeFile(dir / "in.jsonl", "{\"content\": \"a\\nb\", \"id\": 1}\n\n{\"content\": \"\\u00e9\"}\n{\"content\": \"\"}\n");
  auto r = prepare("--input " + (dir / "in.jsonl") + " --json-key content --tokenizer byte --output-prefix " + (dir / "o"));
  INFO(r.err);
  REQUIRE(r.exitCode == 0);
  auto ds = IndexedDataset::open(dir / "o");
  REQUIRE(ds.ok());
  REQUIRE(ds->numDocuments() == 2);  // the empty text is skipped
  CHECK(tokensOf(ds->document(0)) == std::vector<int32_t>{'a', '\n', 'b'});
  CHECK(tokensOf(ds->document(1)) == std::vector<int32_t>{0xC3, 0xA9});
}

TEST_CASE("tpc prepare reads NaN, Infinity and -Infinity in JSONL values, as Python's json.loads does", "[prepare][cli]") {
  // Megatron-LM's preprocess_data.py reads each line with json.loads, which takes them as floats; the text key's
  // value must still be a string, and the words inside strings are text.
  test::TempDir dir;
  test::writeFile(dir / "in.jsonl",
                  "{\"text\": \"NaN Infinity\", \"score\": NaN, \"range\": [-Infinity, Infinity]}\n"
                  "{\"meta\": {\"p\": -Infinity, \"q\": \"\\\"NaN\"}, \"text\": \"b\"}\n");
  const std::string out = dir / "o";
  auto r = prepare("--input " + (dir / "in.jsonl") + " --tokenizer byte --output-prefix " + out);
  INFO(r.err);
  REQUIRE(r.exitCode == 0);
  auto ds = IndexedDataset::open(out);
  REQUIRE(ds.ok());
  REQUIRE(ds->numDocuments() == 2);
  CHECK(tokensOf(ds->document(0)) == std::vector<int32_t>{'N', 'a', 'N', ' ', 'I', 'n', 'f', 'i', 'n', 'i', 't', 'y'});
  CHECK(tokensOf(ds->document(1)) == std::vector<int32_t>{'b'});

  fs::remove(out + ".bin");
  fs::remove(out + ".idx");
  test::writeFile(dir / "nan.jsonl", "{\"text\": \"a\"}\n{\"text\": NaN}\n");
  expectFailure(prepare("--input " + (dir / "nan.jsonl") + " --tokenizer byte --output-prefix " + out), out,
                {dir / "nan.jsonl:2: \"text\" is a number, not a string"});
  // What json.loads refuses stays refused: -NaN, and spellings of its own.
  for (const char* bad : {"{\"text\": \"a\", \"x\": -NaN}\n", "{\"text\": \"a\", \"x\": nan}\n",
                          "{\"text\": \"a\", \"x\": inf}\n"}) {
    test::writeFile(dir / "bad.jsonl", bad);
    expectFailure(prepare("--input " + (dir / "bad.jsonl") + " --tokenizer byte --output-prefix " + out), out,
                  {dir / "bad.jsonl:1: not valid JSON"});
  }
}

TEST_CASE("tpc prepare output does not depend on the number of workers", "[prepare][cli]") {
  test::TempDir dir;
  // About 3 MB: several 512 KB batches, lines of varied length, one line longer than a batch.
  std::string text;
  uint64_t state = 3;
  for (int i = 0; i < 20000; ++i) {
    size_t n = 20 + (state = state * 6364136223846793005ull + 1) % 250;
    for (size_t k = 0; k < n; ++k) text += "abcdefgh ijklmnop'qrst 0123"[(k * 7 + i) % 27];
    if (i % 3 == 0) text += " caf\u00e9 \U0001F600";
    text += i % 97 == 0 ? "\n\n" : "\n";
    if (i == 5000) text += std::string(700000, 'z') + "\n";
  }
  test::writeFile(dir / "big.txt", text);
  std::string outputs[3];
  int i = 0;
  for (int workers : {1, 2, 5}) {
    std::string prefix = dir / ("w" + std::to_string(workers));
    auto r = prepare("--input " + (dir / "big.txt") + " --tokenizer byte --append-eod --workers " +
                     std::to_string(workers) + " --output-prefix " + prefix);
    INFO(r.err);
    REQUIRE(r.exitCode == 0);
    outputs[i++] = readFile(prefix + ".idx") + readFile(prefix + ".bin");
  }
  CHECK(outputs[0] == outputs[1]);
  CHECK(outputs[0] == outputs[2]);
  auto ds = IndexedDataset::open(dir / "w2");
  REQUIRE(ds.ok());
  CHECK(ds->numDocuments() == 20001);
}

TEST_CASE("tpc prepare of the Brown corpus with gpt2 matches the tokenizer", "[prepare][cli][brown]") {
  std::string input = dataDir() + "/brown/brown.jsonl";
  if (!fs::exists(input)) FAIL(input << " is missing; run scripts/fetch_data.sh to fetch the Brown corpus");
  std::string gpt2Dir = dataDir() + "/gpt2";
  auto tok = BpeTokenizer::load(gpt2Dir + "/encoder.json", gpt2Dir + "/vocab.bpe");
  if (!tok.ok()) FAIL(tok.error() << "; run scripts/fetch_data.sh to fetch data/gpt2");
  test::TempDir dir;
  auto r = runCommand(tpcBinary() + " prepare --input " + input + " --tokenizer gpt2 --append-eod --workers 2 --output-prefix " +
                      (dir / "brown"));
  INFO(r.err);
  REQUIRE(r.exitCode == 0);
  CHECK_THAT(r.out, Catch::Contains("500 documents"));
  auto ds = IndexedDataset::open(dir / "brown");
  REQUIRE(ds.ok());
  REQUIRE(ds->numDocuments() == 500);
  std::ifstream in(input);
  std::string line;
  for (size_t d = 0; std::getline(in, line); ++d) {
    std::vector<int32_t> ids;
    REQUIRE((*tok)->encode(nlohmann::json::parse(line).at("text").get<std::string>(), ids).ok());
    ids.push_back(50256);
    REQUIRE(tokensOf(ds->document(d)) == ids);
  }
}

TEST_CASE("tpc prepare refuses bad input with the file and line, leaving nothing behind", "[prepare][cli][errors]") {
  test::TempDir dir;
  const std::string out = dir / "out";
  const std::string byteFlags = " --tokenizer byte --output-prefix " + out;

  SECTION("invalid UTF-8") {
    test::writeFile(dir / "bad.txt", "fine\nalso fine\nbroken \xff here\n");
    expectFailure(prepare("--input " + (dir / "bad.txt") + byteFlags), out, {dir / "bad.txt:3:", "UTF-8", "byte 8"});
  }
  SECTION("invalid UTF-8 inside a JSON string, with gpt2") {
    test::writeFile(dir / "bad.jsonl", "{\"text\": \"ok\"}\n{\"text\": \"\xc0\x80\"}\n");
    expectFailure(prepare("--input " + (dir / "bad.jsonl") + " --tokenizer gpt2 --output-prefix " + out), out,
                  {dir / "bad.jsonl:2:", "UTF-8"});
  }
  SECTION("a prefix that names a folder, not the files") {
    test::writeFile(dir / "in.txt", "a line\n");
    std::filesystem::create_directories(dir / "p");
    expectFailure(prepare("--input " + (dir / "in.txt") + " --tokenizer byte --output-prefix " + (dir / "p/")),
                  dir / "p/", {"--output-prefix '" + (dir / "p/") + "' names no file"});
  }
  SECTION("an output folder that does not exist, or a PREFIX.bin that is a folder, before any work") {
    test::writeFile(dir / "in.txt", "a line\n");
    auto missing = prepare("--input " + (dir / "in.txt") + " --tokenizer byte --output-prefix " + (dir / "nodir/out"));
    CHECK(missing.exitCode == 1);
    CHECK(missing.err == "--output-prefix " + (dir / "nodir/out.bin") + ": error: the folder " + (dir / "nodir") +
                             " does not exist; create it first\n");
    fs::create_directories(dir / "out.bin");
    auto folder = prepare("--input " + (dir / "in.txt") + " --tokenizer byte --output-prefix " + out);
    CHECK(folder.exitCode == 1);
    CHECK(folder.err == "--output-prefix " + out + ".bin: error: is a directory; name a file to write, not a folder\n");
    CHECK(fs::is_empty(dir / "out.bin"));
    CHECK(filesOf(out) == std::vector<std::string>{"out.bin"});  // the folder, and nothing else
  }
  SECTION("--json-key for a .txt input, which is read as text: a JSONL corpus under the wrong name") {
    test::writeFile(dir / "corpus.txt", "{\"text\": \"a\"}\n");
    expectFailure(prepare("--input " + (dir / "corpus.txt") + " --json-key text" + byteFlags), out,
                  {"--json-key applies to JSONL input, but " + (dir / "corpus.txt") + " is read as plain text",
                   "name it .jsonl"});
  }
  SECTION("an empty input") {
    test::writeFile(dir / "empty.txt", "");
    expectFailure(prepare("--input " + (dir / "empty.txt") + byteFlags), out, {dir / "empty.txt", "no documents"});
    test::writeFile(dir / "blank.jsonl", "\n\n{\"text\": \"\"}\n");
    expectFailure(prepare("--input " + (dir / "blank.jsonl") + byteFlags), out, {"no documents"});
  }
  SECTION("a JSONL line without the key") {
    test::writeFile(dir / "nokey.jsonl", "{\"text\": \"a\"}\n{\"body\": \"b\"}\n");
    expectFailure(prepare("--input " + (dir / "nokey.jsonl") + byteFlags), out,
                  {dir / "nokey.jsonl:2:", "no \"text\" key", "--json-key"});
  }
  SECTION("a JSONL value that is not a string, or a line that is not an object") {
    test::writeFile(dir / "num.jsonl", "{\"text\": 5}\n");
    expectFailure(prepare("--input " + (dir / "num.jsonl") + byteFlags), out, {"num.jsonl:1:", "not a string"});
    test::writeFile(dir / "arr.jsonl", "[1, 2]\n");
    expectFailure(prepare("--input " + (dir / "arr.jsonl") + byteFlags), out, {"arr.jsonl:1:", "JSON object"});
  }
  SECTION("a folder as the input") {
    // It said "cannot tell the format", and named FILE.txt, which a folder renamed so still is not.
    std::filesystem::create_directory(dir / "corpus.txt");
    expectFailure(prepare("--input " + (dir / "corpus.txt") + byteFlags), out,
                  {dir / "corpus.txt" + " is a directory; give one corpus file"});
  }
  SECTION("a line that is not JSON") {
    test::writeFile(dir / "broken.jsonl", "{\"text\": \"a\"}\n{\"text\": \"b\"\n");
    expectFailure(prepare("--input " + (dir / "broken.jsonl") + byteFlags), out, {"broken.jsonl:2:", "not valid JSON"});
    // An unclosed string of a megabyte: the error quotes its last 40 bytes, not all of it.
    test::writeFile(dir / "long.jsonl", "{\"text\": \"" + std::string(1 << 20, 'x') + "yz\n");
    auto longLine = prepare("--input " + (dir / "long.jsonl") + byteFlags);
    expectFailure(longLine, out, {"long.jsonl:1: not valid JSON", "; last read: '..." + std::string(38, 'x') + "yz"});
    CHECK(longLine.err.size() < 400);
  }
  SECTION("a pretty-printed JSON file or array, not one object a line") {
    test::writeFile(dir / "array.json", "[\n  {\"text\": \"a\"}\n]\n");
    expectFailure(prepare("--input " + (dir / "array.json") + byteFlags), out,
                  {"array.json:1: not valid JSON", "write the corpus as JSON Lines"});
    test::writeFile(dir / "pretty.jsonl", "{\n  \"text\": \"a\"\n}\n");
    expectFailure(prepare("--input " + (dir / "pretty.jsonl") + byteFlags), out,
                  {"pretty.jsonl:1: not valid JSON", "write the corpus as JSON Lines"});
  }
  SECTION("a late error after many good batches") {
    std::string text;
    for (int i = 0; i < 30000; ++i) text += "a line of perfectly good text number " + std::to_string(i) + "\n";
    text += "\xfe\n";
    test::writeFile(dir / "late.txt", text);
    expectFailure(prepare("--input " + (dir / "late.txt") + byteFlags + " --workers 3"), out, {"late.txt:30001:"});
  }
  SECTION("a missing input, an unknown format, an unknown tokenizer, a missing flag") {
    expectFailure(prepare("--input " + (dir / "nope.txt") + byteFlags), out, {"nope.txt", "cannot open"});
    test::writeFile(dir / "in.csv", "a\n");
    expectFailure(prepare("--input " + (dir / "in.csv") + byteFlags), out, {"in.csv", ".jsonl"});
    test::writeFile(dir / "in.txt", "a\n");
    expectFailure(prepare("--input " + (dir / "in.txt") + " --tokenizer words --output-prefix " + out), out,
                  {"unknown tokenizer 'words'"});
    expectFailure(prepare("--input " + (dir / "in.txt") + " --tokenizer byte"), out, {"--output-prefix"});
    expectFailure(prepare("--input " + (dir / "in.txt") + byteFlags + " --workers 0"), out, {"--workers"});
  }
  SECTION("missing or malformed GPT-2 vocabulary") {
    test::writeFile(dir / "in.txt", "a\n");
    fs::create_directories(dir.path / "data" / "gpt2");
    const std::string env = "TPC_DATA_DIR=" + (dir / "data") + " ";
    auto missing = runCommand(env + tpcBinary() + " prepare --input " + (dir / "in.txt") + " --tokenizer gpt2 --output-prefix " + out);
    expectFailure(missing, out, {dir / "data/gpt2/encoder.json", "scripts/fetch_data.sh"});
    test::writeFile(dir / "data/gpt2/encoder.json", "{\"a\": 0,");
    test::writeFile(dir / "data/gpt2/vocab.bpe", "#version: 0.2\n");
    auto malformed = runCommand(env + tpcBinary() + " prepare --input " + (dir / "in.txt") + " --tokenizer gpt2 --output-prefix " + out);
    expectFailure(malformed, out, {dir / "data/gpt2/encoder.json", "not valid JSON"});
  }
}

TEST_CASE("tpc prepare keeps an existing dataset when a new run fails", "[prepare][cli][errors]") {
  test::TempDir dir;
  test::writeFile(dir / "good.txt", "hello\n");
  REQUIRE(prepare("--input " + (dir / "good.txt") + " --tokenizer byte --output-prefix " + (dir / "ds")).exitCode == 0);
  std::string before = readFile(dir / "ds.idx") + readFile(dir / "ds.bin");
  test::writeFile(dir / "bad.txt", "hello\n\xff\n");
  auto r = prepare("--input " + (dir / "bad.txt") + " --tokenizer byte --output-prefix " + (dir / "ds"));
  CHECK(r.exitCode == 1);
  CHECK(readFile(dir / "ds.idx") + readFile(dir / "ds.bin") == before);
  CHECK(filesOf(dir / "ds") == std::vector<std::string>{"ds.bin", "ds.idx"});
}

TEST_CASE("tpc prepare stopped by Ctrl-C leaves no temporary file and keeps the old dataset", "[prepare][cli][errors]") {
  test::TempDir dir;
  test::writeFile(dir / "small.txt", "hello\n");
  REQUIRE(prepare("--input " + (dir / "small.txt") + " --tokenizer byte --output-prefix " + (dir / "ds")).exitCode == 0);
  const std::string before = readFile(dir / "ds.idx") + readFile(dir / "ds.bin");
  // About 60 MB: a second or more of tokenizing, long after the temporary .bin appears.
  std::string line = "a line of text to keep the tokenizer busy for a while, long enough to interrupt\n", text;
  while (text.size() < 60'000'000) text += line;
  test::writeFile(dir / "big.txt", text);
  const std::string tpc = tpcBinary(), input = dir / "big.txt", prefix = dir / "ds";
  pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    ::signal(SIGINT, SIG_DFL);  // as a terminal's Ctrl-C finds it, whatever the test runner set
    int null = ::open("/dev/null", O_WRONLY);
    ::dup2(null, 1), ::dup2(null, 2);
    ::execl(tpc.c_str(), tpc.c_str(), "prepare", "--input", input.c_str(), "--tokenizer", "byte", "--output-prefix",
            prefix.c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  for (int i = 0; i < 20000 && filesOf(prefix).size() < 3; ++i) ::usleep(500);  // ds.bin, ds.idx, ds.bin.tmp.PID.N
  ::kill(pid, SIGINT);
  int status = 0;
  REQUIRE(::waitpid(pid, &status, 0) == pid);
  // It died of the signal (had it finished first, the test proves nothing and says so).
  REQUIRE(WIFSIGNALED(status));
  CHECK(WTERMSIG(status) == SIGINT);
  CHECK(filesOf(prefix) == std::vector<std::string>{"ds.bin", "ds.idx"});
  CHECK(readFile(dir / "ds.idx") + readFile(dir / "ds.bin") == before);
}

TEST_CASE("tpc prepare stopped by Ctrl-C between its .bin and .idx still leaves a pair of one run", "[prepare][cli][errors]") {
  test::TempDir dir;
  test::writeFile(dir / "small.txt", "hello\n");
  REQUIRE(prepare("--input " + (dir / "small.txt") + " --tokenizer byte --output-prefix " + (dir / "ds")).exitCode == 0);
  test::writeFile(dir / "more.txt", "hello\nand a longer second document\n");
  // A test hook raises SIGINT right after ds.bin is in place, as a Ctrl-C there would: the run ends of it once ds.idx
  // is in place too, not with the new .bin beside the old .idx.
  auto r = runCommand("TPC_TEST_SIGINT_AFTER_RENAME=ds.bin " + tpcBinary() + " prepare --quiet --input " +
                      (dir / "more.txt") + " --tokenizer byte --output-prefix " + (dir / "ds"));
  CHECK(r.exitCode == 128 + SIGINT);
  auto ds = IndexedDataset::open(dir / "ds");
  REQUIRE(ds.ok());
  CHECK(ds->numDocuments() == 2);
  CHECK(readFile(dir / "ds.bin").size() == 2 * (5 + 28));  // the new .bin (two bytes a token)
  CHECK(filesOf(dir / "ds") == std::vector<std::string>{"ds.bin", "ds.idx"});
}

TEST_CASE("two tpc prepare runs to one prefix at once leave one run's .bin and .idx, not a mix", "[prepare][errors]") {
  test::TempDir dir;
  auto byte = loadTokenizer("byte");
  REQUIRE(byte.ok());
  // Two corpora of different sizes (so a .bin of one never fits the .idx of the other), small enough that both runs
  // reach their commits at about the same time.
  std::string x, y;
  while (x.size() < 200'000) x += "the first corpus, line " + std::to_string(x.size()) + "\n";
  while (y.size() < 300'000) y += "a second corpus with other lines " + std::to_string(y.size()) + "\n";
  test::writeFile(dir / "x.txt", x);
  test::writeFile(dir / "y.txt", y);
  // Each alone, for what a consistent pair is.
  std::string expected[2];
  for (int i = 0; i < 2; ++i) {
    PrepareOptions o;
    o.input = dir / (i == 0 ? "x.txt" : "y.txt");
    o.outputPrefix = dir / (i == 0 ? "alone_x" : "alone_y");
    o.progress = false;
    REQUIRE(prepareDataset(o, **byte).ok());
    expected[i] = readFile(o.outputPrefix + ".bin") + readFile(o.outputPrefix + ".idx");
  }
  REQUIRE(expected[0] != expected[1]);
  const std::string prefix = dir / "ds";
  for (int round = 0; round < 3; ++round) {
    int go[2];
    REQUIRE(::pipe(go) == 0);
    std::vector<pid_t> pids;
    for (int i = 0; i < 2; ++i) {
      pid_t pid = fork();
      REQUIRE(pid >= 0);
      if (pid == 0) {
        ::close(go[1]);
        char c;
        if (::read(go[0], &c, 1) != 0) ::_exit(2);  // both start when the parent closes the pipe
        // Run 0 waits between its .bin and .idx renames, run 1 before its .bin: unless something keeps the two
        // commits apart, run 1's pair lands between run 0's .bin and .idx.
        static int run;
        run = i;
        FileCommit::setStepHookForTesting([](size_t step) { ::usleep(step == (run == 0 ? 1 : 0) ? 300000 : 0); });
        PrepareOptions o;
        o.input = dir / (i == 0 ? "x.txt" : "y.txt");
        o.outputPrefix = prefix;
        o.progress = false;
        auto r = prepareDataset(o, **byte);
        ::_exit(r.ok() ? 0 : 1);
      }
      pids.push_back(pid);
    }
    ::close(go[0]);
    ::close(go[1]);
    for (pid_t pid : pids) {
      int status = 0;
      REQUIRE(::waitpid(pid, &status, 0) == pid);
      CHECK(WIFEXITED(status));
      CHECK(WEXITSTATUS(status) == 0);
    }
    INFO("round " << round);
    const std::string got = readFile(prefix + ".bin") + readFile(prefix + ".idx");
    CHECK((got == expected[0] || got == expected[1]));
    CHECK(IndexedDataset::open(prefix).ok());
    CHECK(filesOf(prefix) == std::vector<std::string>{"ds.bin", "ds.idx"});
  }
}

TEST_CASE("tpc prepare --help explains the formats", "[prepare][cli]") {
  auto r = runCommand(tpcBinary() + " prepare --help");
  CHECK(r.exitCode == 0);
  CHECK_THAT(r.out, Catch::Contains("each line that is not blank is a document") && Catch::Contains("--json-key") &&
                        Catch::Contains("--append-eod") && Catch::Contains("--workers"));
}
