// The hidden case below fails exactly 77 checks. tests/CMakeLists.txt runs it alone (test
// `unit.runner_77_failures_is_not_skipped`) and requires exit code 78: Catch2 would exit 77, which CTest reads as
// "skipped" (tests/catch_main.h).
#include <catch2/catch.hpp>

TEST_CASE("runner: a case with 77 failed checks (hidden, run by unit.runner_77_failures_is_not_skipped)",
          "[.][runner77]") {
  for (int i = 0; i < 77; ++i) CHECK(i < 0);
}
