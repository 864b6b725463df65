// Fuzzes the .tir parser. Any input must parse or give an error; a graph that parses must print to text
// that parses again and prints identically (the round-trip promise of ir/printer.h).
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "fuzz_check.h"
#include "ir/parser.h"
#include "ir/printer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view text(reinterpret_cast<const char*>(data), size);
  auto g = tpc::parseGraph(text, "fuzz.tir");
  if (!g) return 0;
  std::string printed = tpc::printGraph(**g);
  auto again = tpc::parseGraph(printed, "printed.tir");
  FUZZ_CHECK(again.ok(), "the printed graph does not parse: " + again.error() + "\n" + printed);
  std::string reprinted = tpc::printGraph(**again);
  FUZZ_CHECK(printed == reprinted, "print(parse(print(g))) != print(g):\n" + printed + "\n---\n" + reprinted);
  return 0;
}
