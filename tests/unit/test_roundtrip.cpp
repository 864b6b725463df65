// The text form round-trips: every .tir file of the source tree (but the malformed corpus in
// tests/ir/errors/) parses, and printing, parsing and printing again gives the same text.
#include <catch2/catch.hpp>

#include <filesystem>
#include <regex>
#include <set>

#include "ir/op.h"
#include "ir/parser.h"
#include "ir/printer.h"
#include "test_support.h"

namespace fs = std::filesystem;
using namespace tpc;

namespace {

// .tir files under `root`, skipping hidden folders, build trees (they hold a CMakeCache.txt) and `skip`.
std::vector<fs::path> tirFiles(const fs::path& root, const fs::path& skip) {
  std::vector<fs::path> out;
  for (auto it = fs::recursive_directory_iterator(root); it != fs::recursive_directory_iterator(); ++it) {
    const fs::path& p = it->path();
    if (it->is_directory()) {
      std::string name = p.filename().string();
      if ((!name.empty() && name[0] == '.') || fs::exists(p / "CMakeCache.txt") || fs::equivalent(p, skip))
        it.disable_recursion_pending();
      continue;
    }
    if (p.extension() == ".tir") out.push_back(p);
  }
  std::sort(out.begin(), out.end());
  return out;
}

// Splits on "// -----" lines like `tpc opt --split-input-file`; each case keeps its line numbers.
std::vector<std::string> splitCases(const std::string& text) {
  std::vector<std::string> cases(1);
  size_t pos = 0;
  int line = 1;
  while (pos < text.size()) {
    size_t nl = text.find('\n', pos);
    std::string l = text.substr(pos, nl == std::string::npos ? std::string::npos : nl - pos);
    if (l == "// -----") cases.emplace_back(line, '\n');
    else cases.back() += l + "\n";
    pos = nl == std::string::npos ? text.size() : nl + 1;
    ++line;
  }
  return cases;
}

}  // namespace

TEST_CASE("every .tir file in the source tree round-trips through print and parse", "[ir][roundtrip]") {
  fs::path root = test::sourcePath("");
  auto files = tirFiles(root, root / "tests/ir/errors");
  // The corpus this test relies on: the model block, the realistic examples and the golden inputs.
  REQUIRE(files.size() >= 10);
  size_t goldenFiles = 0, cases = 0;
  for (const fs::path& f : files) {
    bool golden = f.parent_path().filename() == "golden";
    goldenFiles += golden;
    auto chunks = splitCases(test::readFile(f.string()));
    for (size_t i = 0; i < chunks.size(); ++i) {
      INFO(f.string() << " case " << i + 1);
      if (holdsNoGraph(chunks[i])) continue;  // as tpc opt --split-input-file skips it
      auto g1 = parseGraph(chunks[i], f.string());
      if (!g1) FAIL(g1.error());
      std::string p1 = printGraph(**g1);
      auto g2 = parseGraph(p1, f.string() + " (printed)");
      if (!g2) FAIL("the printed form does not parse: " << g2.error() << "\n" << p1);
      std::string p2 = printGraph(**g2);
      CHECK(p1 == p2);
      ++cases;
    }
  }
  CHECK(goldenFiles >= 5);
  CHECK(cases > files.size());  // the --split-input-file goldens hold several cases each
}

TEST_CASE("every op of ops.def is used in some .tir file under tests/ir", "[ir][roundtrip]") {
  fs::path root = test::sourcePath("tests/ir");
  std::string corpus;
  for (const fs::path& f : tirFiles(root, root / "errors")) corpus += test::readFile(f.string());
  REQUIRE(!corpus.empty());
  std::vector<std::string> missing;
  for (const OpInfo& op : allOps()) {
    std::regex use("=\\s*" + std::string(op.name) + "\\(");
    if (!std::regex_search(corpus, use)) missing.push_back(std::string(op.name));
  }
  INFO("ops never used in tests/ir/*.tir: " << [&] {
    std::string s;
    for (auto& m : missing) s += m + " ";
    return s;
  }());
  CHECK(missing.empty());
}

TEST_CASE("the printer's tricky values parse back to the same text", "[ir][roundtrip]") {
  // Special floats, quoted strings, output names that are not identifiers, multi-result placements.
  const char* text = R"(graph @tricky(%x: f32[2,4] place=[tp:S(1)]) mesh(tp=2) {
  %a = scale(%x) {factor=1e-05} : f32[2,4]
  %b = scale(%a) {factor=-inf} : f32[2,4]
  %c = full() {shape=[2,4], value=nan, dtype=bf16} : bf16[2,4]
  %d = all_reduce(%b) {axis=tp, op="max"} : f32[2,4] {place=[tp:R]}
  %dx, %dg, %db = layer_norm_grad(%d, %b, %g) : f32[2,4], f32[4], f32[4] {place=([tp:R], ?, [tp:P])}
  return "2b"=%d, "true"=%c, %dx
})";
  // %g is undefined above on purpose: first check the error, then fix it.
  auto bad = parseGraph(text, "t.tir");
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.error() == "t.tir:6:43: error: use of undefined value %g");
  std::string fixed = std::regex_replace(std::string(text), std::regex("%x: f32\\[2,4\\] place=\\[tp:S\\(1\\)\\]\\)"),
                                         "%x: f32[2,4] place=[tp:S(1)], %g: f32[4])");
  auto g = parseGraph(fixed, "t.tir");
  if (!g) FAIL(g.error());
  std::string p1 = printGraph(**g);
  CHECK(p1.find("{factor=1e-05}") != std::string::npos);
  CHECK(p1.find("{factor=-inf}") != std::string::npos);
  CHECK(p1.find("op=max") != std::string::npos);  // a string that is an identifier prints bare
  CHECK(p1.find("{place=([tp:R], ?, [tp:P])}") != std::string::npos);
  CHECK(p1.find("return \"2b\"=%d, \"true\"=%c, %dx") != std::string::npos);
  auto g2 = parseGraph(p1, "printed");
  if (!g2) FAIL(g2.error());
  CHECK(printGraph(**g2) == p1);
}
