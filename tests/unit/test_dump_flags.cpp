// `tpc dump`'s flags: the dot form shows the fusion groups; --sp at tp 1 adds nothing to the pipeline.
#include <regex>
#include <set>
#include <vector>

#include <catch2/catch.hpp>

#include "test_support.h"

namespace tpc {
namespace {

std::string dump() { return test::tpcBinary() + " dump " + test::binaryPath("models/tiny.fb"); }

// One error line, nothing on stdout, exit 1.
void checkRefused(const test::CommandResult& r, const std::string& expected) {
  INFO(r.out << r.err);
  CHECK(r.exitCode == 1);
  CHECK(r.out.empty());
  CHECK(r.err == "tpc dump: error: " + expected + "\n");
}

TEST_CASE("tpc dump --format dot shows the fusion groups and stays valid dot", "[dump][cli][fusion]") {
  auto fused = test::runCommand(dump() + " --format dot --after=fuse");
  INFO(fused.err);
  REQUIRE(fused.exitCode == 0);
  CHECK_THAT(fused.out, Catch::StartsWith("digraph"));
  CHECK_THAT(fused.out, Catch::Contains("subgraph cluster_fusion_0 {"));
  CHECK_THAT(fused.out, Catch::Contains("\\nfusion_group=0\""));
  CHECK(dotProblems(fused.out) == "");
  auto plain = test::runCommand(dump() + " --format dot --tp 2 --after=partition");
  REQUIRE(plain.exitCode == 0);
  CHECK(plain.out.find("fusion_group") == std::string::npos);  // before fuse there are none
  CHECK(dotProblems(plain.out) == "");
  CHECK(dotProblems("digraph g {\n  a0 -> n0;\n}\n") == "node a0 is used but not declared");  // the checker checks
  CHECK(dotProblems("digraph g {\n  n0 [label=\"}\"];\n") == "unbalanced braces");
  // Graphviz itself, where it is installed.
  if (test::runCommand("command -v dot").exitCode == 0) {
    test::TempDir dir;
    std::string file = dir / "fused.dot";
    test::writeFile(file, fused.out);
    auto dot = test::runCommand("dot -Tcanon " + file);
    INFO(dot.err);
    CHECK(dot.exitCode == 0);
  }
}

TEST_CASE("tpc dump --sp with tp 1: the pipeline gains nothing, as its warning says", "[dump][cli]") {
  auto plain = test::runCommand(dump() + " --print-pipeline");
  auto sp = test::runCommand(dump() + " --sp --print-pipeline");
  REQUIRE(sp.exitCode == 0);
  CHECK(sp.out == plain.out);
  CHECK(sp.err == "tpc dump: warning: --sp does nothing with tp 1 (it splits the sequence over the tp ranks); add --tp N\n");
  auto summary = test::runCommand(dump() + " --sp --summary");
  REQUIRE(summary.exitCode == 0);
  CHECK(summary.out == "collectives per step (no mesh):\n  none\n  total: 0 bytes\n");
  // With tp 2 --sp still splits the sequence.
  CHECK_THAT(test::runCommand(dump() + " --tp 2 --sp --print-pipeline").out, Catch::Contains("sequence-parallel"));
}

}  // namespace
}  // namespace tpc
