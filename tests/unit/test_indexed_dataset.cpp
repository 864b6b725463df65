// Megatron indexed datasets: the exact .idx/.bin bytes, writer/reader round trip, every kind of bad file,
// the --split arithmetic, and TokenWindows' order, windows and exact resumption.
#include <catch2/catch.hpp>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "frontend/dataset_writer.h"
#include "frontend/indexed_dataset.h"
#include "frontend/token_windows.h"
#include "ir/file_io.h"
#include "test_support.h"

namespace fs = std::filesystem;
using namespace tpc;
using tpc::test::readFile;

namespace {


void writeBytes(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc).write(bytes.data(), std::streamsize(bytes.size()));
}

void writeDataset(const std::string& prefix, const std::vector<std::vector<int32_t>>& docs,
                  TokenDType dtype = TokenDType::UInt16) {
  auto w = DatasetWriter::create(prefix, dtype);
  REQUIRE(w.ok());
  for (const auto& d : docs) REQUIRE(w->addDocument(d).ok());
  REQUIRE(w->finish().ok());
}

std::vector<int32_t> tokensOf(const TokenSpan& s) {
  std::vector<int32_t> v(s.size());
  s.copyTo(v.data(), 0, s.size());
  return v;
}

std::string u64(uint64_t v) { return std::string(reinterpret_cast<const char*>(&v), 8); }
std::string i32(int32_t v) { return std::string(reinterpret_cast<const char*>(&v), 4); }

// An index over `binBytes` bytes of tokens that open() cannot refuse, yet unlike the writer's: a random token
// dtype whose size divides them, random sequence lengths (some empty) back to back over them, random documents.
template <class Rnd>
std::string consistentIndex(Rnd& rnd, size_t binBytes) {
  std::vector<uint8_t> codes;
  for (TokenDType t : {TokenDType::UInt8, TokenDType::Int8, TokenDType::Int16, TokenDType::UInt16, TokenDType::Int32,
                       TokenDType::Int64})
    if (binBytes % tokenDTypeBytes(uint8_t(t)) == 0) codes.push_back(uint8_t(t));
  const uint8_t code = codes[rnd() % codes.size()];
  const uint64_t tokens = binBytes / tokenDTypeBytes(code);
  const uint64_t numSeq = tokens ? 1 + rnd() % 6 : rnd() % 3;  // sequences must cover every token
  auto cuts = [&](size_t n, uint64_t upTo) {  // 0, n - 1 sorted random points in [0, upTo], upTo
    std::vector<uint64_t> c = {0};
    for (size_t i = 1; i < n; ++i) c.push_back(rnd() % (upTo + 1));
    std::sort(c.begin(), c.end());
    c.push_back(upTo);
    return c;
  };
  std::vector<uint64_t> seqStart = cuts(numSeq, tokens), docIdx = cuts(1 + rnd() % 4, numSeq);
  std::string b(kIndexMagic, sizeof(kIndexMagic));
  b += u64(kIndexVersion) + std::string(1, char(code)) + u64(numSeq) + u64(docIdx.size());
  for (size_t i = 0; i < numSeq; ++i) b += i32(int32_t(seqStart[i + 1] - seqStart[i]));
  for (size_t i = 0; i < numSeq; ++i) b += u64(seqStart[i] * tokenDTypeBytes(code));
  for (uint64_t d : docIdx) b += u64(d);
  return b;
}

// Opening must fail with a message naming `file` and containing `what`.
void expectOpenError(const std::string& prefix, const std::string& file, const std::string& what) {
  auto r = IndexedDataset::open(prefix);
  REQUIRE_FALSE(r.ok());
  CHECK_THAT(r.error(), Catch::Contains(file) && Catch::Contains(what));
}

}  // namespace

TEST_CASE("the .idx and .bin bytes follow Megatron's MMIDIDX layout", "[dataset]") {
  test::TempDir dir;
  const std::string prefix = dir / "tiny";
  writeDataset(prefix, {{1, 2, 3}, {0x1234}});
  // Written out by hand from the layout in megatron/core/datasets/indexed_dataset.py (_IndexWriter).
  const std::vector<uint8_t> expectedIdx = {
      'M', 'M', 'I', 'D', 'I', 'D', 'X', 0, 0,  // magic
      1, 0, 0, 0, 0, 0, 0, 0,                   // u64 version 1
      8,                                        // u8 dtype code: uint16
      2, 0, 0, 0, 0, 0, 0, 0,                   // u64 sequence count
      3, 0, 0, 0, 0, 0, 0, 0,                   // u64 document index count (documents + 1)
      3, 0, 0, 0, 1, 0, 0, 0,                   // i32 sequence lengths
      0, 0, 0, 0, 0, 0, 0, 0,                   // i64 byte offsets: 0
      6, 0, 0, 0, 0, 0, 0, 0,                   //   3 tokens * 2 bytes
      0, 0, 0, 0, 0, 0, 0, 0,                   // i64 document index: 0,
      1, 0, 0, 0, 0, 0, 0, 0,                   //   end of document 0
      2, 0, 0, 0, 0, 0, 0, 0,                   //   end of document 1
  };
  std::string idx = readFile(prefix + ".idx");
  CHECK(std::vector<uint8_t>(idx.begin(), idx.end()) == expectedIdx);
  const std::vector<uint8_t> expectedBin = {1, 0, 2, 0, 3, 0, 0x34, 0x12};  // little-endian uint16
  std::string bin = readFile(prefix + ".bin");
  CHECK(std::vector<uint8_t>(bin.begin(), bin.end()) == expectedBin);
  std::set<std::string> names;
  for (const auto& e : fs::directory_iterator(dir.path)) names.insert(e.path().filename().string());
  CHECK(names == std::set<std::string>{"tiny.bin", "tiny.idx"});  // no temporary left
  CHECK(DatasetWriter::indexBytes(TokenDType::UInt16, std::vector<int32_t>{3, 1}) == idx);
}

TEST_CASE("writer and reader round-trip documents", "[dataset]") {
  test::TempDir dir;
  std::vector<std::vector<int32_t>> docs;
  uint64_t state = 7, total = 0;
  for (int d = 0; d < 300; ++d) {
    state = state * 6364136223846793005ull + 1;
    std::vector<int32_t> doc((state >> 40) % 500);
    for (auto& t : doc) t = static_cast<int32_t>((state = state * 6364136223846793005ull + 1) >> 48);  // < 65536
    total += doc.size();
    docs.push_back(doc);
  }
  for (TokenDType dtype : {TokenDType::UInt16, TokenDType::Int32, TokenDType::Int64}) {
    const std::string prefix = dir / ("rt" + std::to_string(int(dtype)));
    writeDataset(prefix, docs, dtype);
    auto ds = IndexedDataset::open(prefix);
    REQUIRE(ds.ok());
    CHECK(ds->dtype() == dtype);
    CHECK(ds->numDocuments() == docs.size());
    CHECK(ds->numSequences() == docs.size());
    CHECK(ds->numTokens() == total);
    for (size_t i = 0; i < docs.size(); ++i) {
      REQUIRE(tokensOf(ds->document(i)) == docs[i]);
      REQUIRE(ds->sequenceLength(i) == docs[i].size());
    }
    if (!docs[5].empty()) CHECK(ds->document(5)[0] == docs[5][0]);
    CHECK(ds->checkTokenRange(65536).ok());
  }
  auto ds = IndexedDataset::open(dir / "rt8");
  REQUIRE(ds.ok());
  Status s = ds->checkTokenRange(257);
  REQUIRE_FALSE(s.ok());
  CHECK_THAT(s.error(), Catch::Contains(dir / "rt8.bin") && Catch::Contains("outside the vocabulary [0, 257)"));
}

TEST_CASE("openFromMemory reads what open reads and refuses what open refuses", "[dataset]") {
  test::TempDir dir;
  const std::vector<std::vector<int32_t>> docs = {{1, 2, 3}, {}, {40000, 5}};
  writeDataset(dir / "m", docs);
  const std::string idx = readFile(dir / "m.idx"), bin = readFile(dir / "m.bin");
  auto ds = IndexedDataset::openFromMemory(idx, bin, "mem");
  REQUIRE(ds.ok());
  REQUIRE(ds->numDocuments() == docs.size());
  for (size_t i = 0; i < docs.size(); ++i) CHECK(tokensOf(ds->document(i)) == docs[i]);
  auto truncated = IndexedDataset::openFromMemory(idx, bin.substr(0, bin.size() - 1), "mem");
  REQUIRE_FALSE(truncated.ok());
  CHECK_THAT(truncated.error(), Catch::Contains("mem.bin: truncated"));
  CHECK_FALSE(IndexedDataset::openFromMemory(idx.substr(0, 20), bin, "mem").ok());
}

TEST_CASE("a document may span several sequences", "[dataset]") {
  test::TempDir dir;
  const std::string prefix = dir / "multi";
  // Three sequences {5,6} {7} {8,9,10}; documents: [seq 0, seq 1] and [seq 2].
  std::string idx(kIndexMagic, 9);
  idx += u64(1) + std::string(1, char(8)) + u64(3) + u64(3);
  for (int32_t len : {2, 1, 3}) idx += std::string(reinterpret_cast<const char*>(&len), 4);
  for (uint64_t p : {0, 4, 6}) idx += u64(p);
  for (uint64_t d : {0, 2, 3}) idx += u64(d);
  writeBytes(prefix + ".idx", idx);
  std::string bin;
  for (uint16_t t : {5, 6, 7, 8, 9, 10}) bin += std::string(reinterpret_cast<const char*>(&t), 2);
  writeBytes(prefix + ".bin", bin);
  auto ds = IndexedDataset::open(prefix);
  REQUIRE(ds.ok());
  CHECK(ds->numDocuments() == 2);
  CHECK(tokensOf(ds->document(0)) == std::vector<int32_t>{5, 6, 7});
  CHECK(tokensOf(ds->document(1)) == std::vector<int32_t>{8, 9, 10});
  CHECK(tokensOf(ds->sequence(1)) == std::vector<int32_t>{7});
}

TEST_CASE("a writer that does not finish leaves nothing behind", "[dataset][errors]") {
  test::TempDir dir;
  const std::string prefix = dir / "gone";
  {
    auto w = DatasetWriter::create(prefix, TokenDType::UInt16);
    REQUIRE(w.ok());
    REQUIRE(w->addDocument(std::vector<int32_t>{1, 2}).ok());
    Status s = w->addDocument(std::vector<int32_t>{70000});
    REQUIRE_FALSE(s.ok());
    CHECK_THAT(s.error(), Catch::Contains("70000") && Catch::Contains("uint16"));
  }
  CHECK(fs::is_empty(dir.path));
  auto noDir = DatasetWriter::create(dir / "no/such/dir/x", TokenDType::UInt16);
  REQUIRE_FALSE(noDir.ok());
  CHECK_THAT(noDir.error(), Catch::StartsWith("cannot create " + (dir / "no/such/dir/x.bin") + " (its temporary " +
                                              (dir / "no/such/dir/x.bin.tmp.")));
}

TEST_CASE("a signal between the .bin and the .idx renames still leaves the new pair", "[dataset][errors]") {
  test::TempDir dir;
  const std::string prefix = dir / "ds";
  writeDataset(prefix, {{1, 2, 3}});
  const std::string oldPair = test::readFile(prefix + ".bin") + test::readFile(prefix + ".idx");
  pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    // SIGHUP, as a closed terminal sends it (the test runner catches SIGINT and SIGTERM itself), right after the
    // .bin is in place.
    FileCommit::setStepHookForTesting([](size_t step) {
      if (step == 1) ::raise(SIGHUP);
    });
    auto w = DatasetWriter::create(prefix, TokenDType::UInt16);
    if (!w.ok() || !w->addDocument(std::vector<int32_t>{4, 5, 6, 7, 8}).ok()) ::_exit(2);
    Status s = w->finish();
    ::_exit(s.ok() ? 0 : 3);  // reached only if the signal was lost
  }
  int status = 0;
  REQUIRE(::waitpid(pid, &status, 0) == pid);
  CHECK(WIFSIGNALED(status));
  CHECK(WTERMSIG(status) == SIGHUP);
  auto ds = IndexedDataset::open(prefix);
  REQUIRE(ds.ok());  // a .bin of 5 tokens with the .idx of 3 would be refused
  REQUIRE(ds->numDocuments() == 1);
  CHECK(ds->document(0).size() == 5);
  CHECK(test::readFile(prefix + ".bin") + test::readFile(prefix + ".idx") != oldPair);
  std::set<std::string> names;
  for (const auto& e : fs::directory_iterator(dir.path)) names.insert(e.path().filename().string());
  CHECK(names == std::set<std::string>{"ds.bin", "ds.idx"});
}

TEST_CASE("a dataset truncated while it is mapped ends the reader with one error naming the file", "[dataset][errors]") {
  test::TempDir dir;
  const std::string prefix = dir / "ds";
  std::vector<int32_t> doc(100000);
  for (size_t i = 0; i < doc.size(); ++i) doc[i] = int32_t(i % 60000);
  writeDataset(prefix, {doc});
  const std::string err = dir / "stderr.txt";
  pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    if (!std::freopen(err.c_str(), "w", stderr)) ::_exit(2);
    auto ds = IndexedDataset::open(prefix);
    if (!ds.ok()) ::_exit(3);
    // Another program cuts the file under the mapping; the pages past the new end are gone.
    if (::truncate((prefix + ".bin").c_str(), 100) != 0) ::_exit(4);
    int64_t sum = 0;
    for (int32_t t : tokensOf(ds->document(0))) sum += t;
    ::_exit(sum == 0 ? 6 : 5);  // reached only if the read did not fault
  }
  int status = 0;
  REQUIRE(::waitpid(pid, &status, 0) == pid);
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 1);
  CHECK(test::readFile(err) == "tpc: error: " + prefix + ".bin could not be read (it shrank: truncated or rewritten "
                               "during the run, or the disk failed); restore the file and run again, and make new data "
                               "under another name\n");

  // A SIGBUS outside every mapping is still the signal.
  writeDataset(dir / "whole", {{1, 2, 3}});
  pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    auto ds = IndexedDataset::open(dir / "whole");  // installs the handler
    if (!ds.ok()) ::_exit(3);
    ::raise(SIGBUS);
    ::_exit(5);
  }
  REQUIRE(::waitpid(pid, &status, 0) == pid);
#if defined(__SANITIZE_ADDRESS__)
  // Under ASan the disposition before ours is ASan's handler, which reports the signal and exits with its code: not
  // swallowed (5) and not taken for a shrunk file (1).
  CHECK((WIFSIGNALED(status) || (WIFEXITED(status) && WEXITSTATUS(status) != 1 && WEXITSTATUS(status) != 5)));
#else
  CHECK(WIFSIGNALED(status));
  CHECK(WTERMSIG(status) == SIGBUS);
#endif
}

TEST_CASE("bad .idx and .bin files are refused with the file named", "[dataset][errors]") {
  test::TempDir dir;
  const std::string prefix = dir / "d";
  writeDataset(prefix, {{1, 2, 3}, {4, 5}, {6}});
  const std::string idxPath = prefix + ".idx", binPath = prefix + ".bin";
  const std::string goodIdx = readFile(idxPath), goodBin = readFile(binPath);
  REQUIRE(IndexedDataset::open(prefix).ok());
  auto withIdx = [&](std::string bytes) { writeBytes(idxPath, bytes); };

  SECTION("missing files") {
    expectOpenError(dir / "nothing", dir / "nothing.idx", "cannot open");
    fs::remove(binPath);
    expectOpenError(prefix, binPath, "cannot open");
  }
  SECTION("wrong magic") {
    std::string b = goodIdx;
    b[0] = 'X';
    withIdx(b);
    expectOpenError(prefix, idxPath, "MMIDIDX");
  }
  SECTION("wrong version") {
    std::string b = goodIdx;
    b[9] = 2;
    withIdx(b);
    expectOpenError(prefix, idxPath, "version 2");
  }
  SECTION("unknown or non-integer dtype") {
    std::string b = goodIdx;
    b[17] = 9;
    withIdx(b);
    expectOpenError(prefix, idxPath, "dtype code 9");
    b[17] = 7;
    withIdx(b);
    expectOpenError(prefix, idxPath, "float32");
  }
  SECTION("truncated .idx") {
    withIdx(goodIdx.substr(0, 20));
    expectOpenError(prefix, idxPath, "truncated");
    withIdx(goodIdx.substr(0, goodIdx.size() - 8));
    expectOpenError(prefix, idxPath, "truncated");
    withIdx("");
    expectOpenError(prefix, idxPath, "truncated");
  }
  SECTION("extra bytes after the index") {
    withIdx(goodIdx + "xx");
    expectOpenError(prefix, idxPath, "unexpected bytes");
  }
  SECTION("counts too large for the file, chosen to overflow a naive size computation") {
    for (uint64_t count : {uint64_t(1) << 62, ~uint64_t(0), uint64_t(0x1555555555555556)}) {
      std::string b = goodIdx;
      b.replace(18, 8, u64(count));
      withIdx(b);
      expectOpenError(prefix, idxPath, "truncated");
      b = goodIdx;
      b.replace(26, 8, u64(count));
      withIdx(b);
      expectOpenError(prefix, idxPath, "truncated");
    }
  }
  SECTION("truncated .bin") {
    writeBytes(binPath, goodBin.substr(0, goodBin.size() - 2));
    expectOpenError(prefix, binPath, "truncated");
    writeBytes(binPath, "");
    expectOpenError(prefix, binPath, "truncated");
  }
  SECTION(".bin longer than the index says") {
    writeBytes(binPath, goodBin + "zz");
    expectOpenError(prefix, binPath, "do not belong together");
  }
  SECTION("a sequence pointer outside .bin") {
    std::string b = goodIdx;
    b.replace(kIndexHeaderBytes + 3 * 4 + 8, 8, u64(1000));  // pointer of sequence 1
    withIdx(b);
    expectOpenError(prefix, idxPath, "sequence 1 starts at byte 1000");
  }
  SECTION("a negative length") {
    std::string b = goodIdx;
    int32_t neg = -5;
    b.replace(kIndexHeaderBytes, 4, std::string(reinterpret_cast<const char*>(&neg), 4));
    withIdx(b);
    expectOpenError(prefix, idxPath, "negative length");
  }
  SECTION("a document index out of order or past the sequences") {
    const size_t docIdx = kIndexHeaderBytes + 3 * 12;
    std::string b = goodIdx;
    b.replace(docIdx, 8, u64(1));
    withIdx(b);
    expectOpenError(prefix, idxPath, "starts with 1");
    b = goodIdx;
    b.replace(docIdx + 16, 8, u64(0));
    withIdx(b);
    expectOpenError(prefix, idxPath, "out of order");
    b = goodIdx;
    b.replace(docIdx + 24, 8, u64(2));
    withIdx(b);
    expectOpenError(prefix, idxPath, "ends at sequence 2");
    b = goodIdx;
    b.replace(docIdx + 8, 8, u64(99));
    withIdx(b);
    expectOpenError(prefix, idxPath, "past the 3 sequences");
  }
}

// Even trials corrupt the writer's index at random bytes (nearly all refused); odd ones write random .bin bytes
// and a random index consistent with them, which open() must accept. Whatever opens, its documents read in
// order are exactly .bin's tokens: every read lies inside the mapping, at the place the index says.
TEST_CASE("randomly corrupted index files never read outside the mapping", "[dataset][errors]") {
  test::TempDir dir;
  const std::string prefix = dir / "fuzz";
  writeDataset(prefix, {{1, 2, 3}, {4, 5}, {}, {6, 7, 8, 9}});
  const std::string goodIdx = readFile(prefix + ".idx"), goodBin = readFile(prefix + ".bin");
  uint64_t state = 99;
  auto rnd = [&] { return (state = state * 6364136223846793005ull + 1442695040888963407ull) >> 33; };
  int opened = 0, refused = 0;
  for (int trial = 0; trial < 600; ++trial) {
    std::string idx = goodIdx, bin = goodBin;
    if (trial % 2 == 0) {
      int edits = 1 + int(rnd() % 3);
      for (int e = 0; e < edits; ++e) idx[rnd() % idx.size()] = static_cast<char>(rnd());
      if (rnd() % 4 == 0) idx.resize(rnd() % idx.size());
    } else {
      bin.resize(rnd() % 49);
      for (char& c : bin) c = static_cast<char>(rnd());
      idx = consistentIndex(rnd, bin.size());
    }
    writeBytes(prefix + ".idx", idx);
    writeBytes(prefix + ".bin", bin);
    auto ds = IndexedDataset::open(prefix);
    INFO("trial " << trial << (ds.ok() ? std::string() : ": " + ds.error()));
    if (!ds.ok()) {
      CHECK(trial % 2 == 0);
      ++refused;
      continue;
    }
    ++opened;
    const size_t item = tokenDTypeBytes(uint8_t(ds->dtype()));
    const TokenSpan whole(reinterpret_cast<const uint8_t*>(bin.data()), bin.size() / item, ds->dtype());
    REQUIRE(ds->numTokens() == whole.size());
    size_t at = 0;
    for (size_t d = 0; d < ds->numDocuments(); ++d) {
      TokenSpan doc = ds->document(d);
      REQUIRE(at + doc.size() <= whole.size());
      for (size_t i = 0; i < doc.size(); ++i, ++at) REQUIRE(doc[i] == whole[at]);
    }
    CHECK(at == whole.size());
  }
  CHECK(opened >= 300);  // every consistent index, so the reads above ran
  CHECK(refused > 250);  // and the corruptions were refused
}

TEST_CASE("the split string divides documents as Megatron's get_train_valid_test_split_", "[dataset][split]") {
  auto check = [](const std::string& spec, uint64_t n, std::array<uint64_t, 4> idx) {
    auto s = splitDocuments(spec, n);
    INFO(spec << " over " << n);
    REQUIRE(s.ok());
    CHECK(s->train == DocRange{idx[0], idx[1]});
    CHECK(s->valid == DocRange{idx[1], idx[2]});
    CHECK(s->test == DocRange{idx[2], idx[3]});
  };
  // Expected values computed with Megatron's Python function.
  check("949,50,1", 1000, {0, 949, 999, 1000});
  check("949,50,1", 500, {0, 475, 500, 500});
  check("949,50,1", 10, {0, 10, 10, 10});
  check("98,2", 100, {0, 98, 100, 100});
  check("98/2", 100, {0, 98, 100, 100});
  check("1", 7, {0, 7, 7, 7});
  check("1,1", 3, {0, 1, 3, 3});  // 1.5 rounds half to even
  check("1,1,1", 1, {0, 1, 1, 1});
  check("80,10,10", 12345, {0, 9877, 11111, 12345});
  // Megatron-LM reads each part as a Python float: fractions, and spaces around a part.
  check("0.8,0.1,0.1", 100, {0, 80, 90, 100});
  check("969, 30, 1", 1000, {0, 969, 999, 1000});
  check(" 100 ", 5, {0, 5, 5, 5});
  // A NUL byte in a part is not the end of it (a model file's string may hold one; written back, it would be cut).
  CHECK_FALSE(splitDocuments(std::string("949,50,\0", 8), 10).ok());
  CHECK_FALSE(splitDocuments(std::string("949,5\0", 6), 10).ok());
  for (const char* bad : {"0,0,0", "a,b", "1,2,3,4", "-1,2", "", "1,,2", "1e400,1", "nan,1", "1 2,3"}) {
    auto s = splitDocuments(bad, 10);
    INFO(bad);
    REQUIRE_FALSE(s.ok());
    CHECK_THAT(s.error(), Catch::Contains("--split"));
  }
}

TEST_CASE("seeded permutations are permutations, fixed by seed and stream", "[dataset][windows]") {
  auto p = seededPermutation(1000, 42, 0);
  CHECK(std::set<uint64_t>(p.begin(), p.end()).size() == 1000);
  CHECK(*std::max_element(p.begin(), p.end()) == 999);
  CHECK(p == seededPermutation(1000, 42, 0));
  CHECK(p != seededPermutation(1000, 43, 0));
  CHECK(p != seededPermutation(1000, 42, 1));
  // Pinned so that a change of generator (which would change every training run's data order) is seen.
  CHECK(seededPermutation(10, 1234, 0) == std::vector<uint64_t>{5, 9, 4, 1, 8, 3, 2, 0, 7, 6});
  CHECK(seededPermutation(0, 1, 0).empty());
  CHECK(seededPermutation(1, 1, 0) == std::vector<uint64_t>{0});
}

namespace {
// Documents whose tokens say where they come from: document d holds d*1000 + k for k in [0, len).
std::vector<std::vector<int32_t>> labelledDocs(int n) {
  std::vector<std::vector<int32_t>> docs;
  for (int d = 0; d < n; ++d) {
    std::vector<int32_t> doc(size_t(3 + (d * 7) % 23));
    for (size_t k = 0; k < doc.size(); ++k) doc[k] = d * 1000 + int32_t(k);
    docs.push_back(doc);
  }
  return docs;
}
}  // namespace

TEST_CASE("token windows cut the shuffled concatenation into overlapping seq+1 windows", "[dataset][windows]") {
  test::TempDir dir;
  const std::string prefix = dir / "w";
  auto docs = labelledDocs(40);
  writeDataset(prefix, docs);
  auto ds = IndexedDataset::open(prefix);
  REQUIRE(ds.ok());
  const DocRange range{5, 35};
  const uint32_t seq = 16;
  TokenWindows windows(*ds, range, seq, 1234);
  REQUIRE(windows.status().ok());
  uint64_t tokens = 0;
  for (uint64_t d = range.begin; d < range.end; ++d) tokens += docs[d].size();
  CHECK(windows.tokensInRange() == tokens);
  REQUIRE(windows.windowsPerEpoch() == (tokens - 1) / seq);

  // Rebuild epoch 0 independently: the documents in seededPermutation order, concatenated.
  auto order = seededPermutation(range.size(), 1234, 0);
  std::vector<int32_t> concat;
  for (uint64_t k : order) concat.insert(concat.end(), docs[range.begin + k].begin(), docs[range.begin + k].end());
  auto windowOrder = seededPermutation(windows.windowsPerEpoch(), 1234, 1);
  std::set<uint64_t> starts;
  std::vector<int32_t> out(seq + 1);
  for (uint64_t i = 0; i < windows.windowsPerEpoch(); ++i) {
    REQUIRE(windows.next(out.data()).ok());
    uint64_t start = windowOrder[i] * seq;
    starts.insert(start);
    REQUIRE(out == std::vector<int32_t>(concat.begin() + long(start), concat.begin() + long(start + seq + 1)));
    for (int32_t t : out) REQUIRE((t / 1000 >= int(range.begin) && t / 1000 < int(range.end)));
  }
  CHECK(starts.size() == windows.windowsPerEpoch());  // every window exactly once per epoch
  CHECK(windows.epoch() == 1);
  REQUIRE(windows.next(out.data()).ok());  // epoch 1 has its own order
  CHECK(windows.position() == windows.windowsPerEpoch() + 1);
}

TEST_CASE("token windows resume exactly from a saved position", "[dataset][windows]") {
  test::TempDir dir;
  const std::string prefix = dir / "r";
  writeDataset(prefix, labelledDocs(25));
  auto ds = IndexedDataset::open(prefix);
  REQUIRE(ds.ok());
  const uint32_t seq = 8;
  TokenWindows a(*ds, {0, 25}, seq, 7);
  REQUIRE(a.status().ok());
  const uint64_t perEpoch = a.windowsPerEpoch();
  std::vector<std::vector<int32_t>> stream;
  for (uint64_t i = 0; i < 3 * perEpoch + 5; ++i) {
    std::vector<int32_t> w(seq + 1);
    REQUIRE(a.next(w.data()).ok());
    stream.push_back(w);
  }
  for (uint64_t saved : {uint64_t(0), uint64_t(3), perEpoch - 1, perEpoch, perEpoch + 2, 2 * perEpoch + 1}) {
    TokenWindows b(*ds, {0, 25}, seq, 7);
    b.seek(saved);
    CHECK(b.position() == saved);
    CHECK(b.epoch() == saved / perEpoch);
    for (uint64_t i = saved; i < saved + perEpoch + 2; ++i) {
      std::vector<int32_t> w(seq + 1);
      REQUIRE(b.next(w.data()).ok());
      INFO("resumed at " << saved << ", window " << i);
      REQUIRE(w == stream[i]);
    }
  }
  // Another seed gives another order; the same seed the same one.
  TokenWindows c(*ds, {0, 25}, seq, 8), d(*ds, {0, 25}, seq, 7);
  std::vector<int32_t> wc(seq + 1), wd(seq + 1);
  bool differs = false;
  for (int i = 0; i < 10; ++i) {
    REQUIRE(c.next(wc.data()).ok());
    REQUIRE(d.next(wd.data()).ok());
    CHECK(wd == stream[size_t(i)]);
    differs = differs || wc != wd;
  }
  CHECK(differs);
}

TEST_CASE("token windows report ranges that cannot give a window", "[dataset][windows][errors]") {
  test::TempDir dir;
  const std::string prefix = dir / "small";
  writeDataset(prefix, {{1, 2, 3}, {4, 5}});
  auto ds = IndexedDataset::open(prefix);
  REQUIRE(ds.ok());
  std::vector<int32_t> out(16);
  TokenWindows tooShort(*ds, {0, 2}, 8, 1);
  Status s = tooShort.next(out.data());
  REQUIRE_FALSE(s.ok());
  CHECK_THAT(s.error(), Catch::Contains("5 tokens") && Catch::Contains("seq-length + 1 = 9"));
  TokenWindows past(*ds, {0, 3}, 2, 1);
  CHECK_THAT(past.status().error(), Catch::Contains("not within the 2 documents"));
  TokenWindows empty(*ds, {1, 1}, 2, 1);
  CHECK_THAT(empty.status().error(), Catch::Contains("no documents"));
  TokenWindows zero(*ds, {0, 2}, 0, 1);
  CHECK_FALSE(zero.status().ok());
  TokenWindows exact(*ds, {0, 2}, 4, 1);  // 5 tokens: exactly one window of 5
  REQUIRE(exact.next(out.data()).ok());
  CHECK(std::vector<int32_t>(out.begin(), out.begin() + 5).size() == 5);
  CHECK(exact.windowsPerEpoch() == 1);
}
