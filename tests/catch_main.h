// Catch2's runner for both test executables. Catch2 exits with the number of failed assertions, and CTest reads
// exit code 77 as "skipped" (SKIP_RETURN_CODE): a case with exactly 77 failures would pass as skipped. Only a
// deliberate skip (std::_Exit(77) where the machine lacks a GPU or a library) may exit 77.
#pragma once
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

int main(int argc, char** argv) {
  int result = Catch::Session().run(argc, argv);
  return result == 77 ? 78 : result;
}
