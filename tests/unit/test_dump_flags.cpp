// `tpc dump`'s flags: --sp at tp 1 adds nothing to the pipeline.
#include <catch2/catch.hpp>

#include "test_support.h"

namespace tpc {
namespace {

std::string dump() { return test::tpcBinary() + " dump " + test::binaryPath("models/tiny.fb"); }

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
