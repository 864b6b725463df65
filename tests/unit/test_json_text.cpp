// JSON from outside files is nesting-checked before llvm::json's recursive parser sees it: a million '['
// in a safetensors header, a state.json or a config.json is one error, not a stack overflow.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <string>

#include "ir/json_text.h"
#include "runtime/checkpoint.h"
#include "runtime/safetensors.h"
#include "test_support.h"

namespace tpc {

TEST_CASE("json text: nesting past the limit is an error naming the byte, strings and escapes don't count", "[json]") {
  auto deep = [](int n) { return std::string(n, '[') + std::string(n, ']'); };
  CHECK(parseJsonText(deep(kMaxJsonNesting)).ok());
  auto tooDeep = parseJsonText(deep(kMaxJsonNesting + 1));
  REQUIRE_FALSE(tooDeep.ok());
  CHECK(tooDeep.error() == "not JSON: nested deeper than 256 levels at byte 256");
  // Brackets inside strings, and an escaped quote that does not end the string, are not nesting.
  auto inString = parseJsonText("{\"k\": \"\\\"" + std::string(100000, '[') + "\"}");
  REQUIRE(inString.ok());
  CHECK(inString->getAsObject()->getString("k")->size() == 100001);
  auto bad = parseJsonText("{\"a\": 1,}");
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.error().rfind("not JSON: ", 0) == 0);
  CHECK(parseJsonText("{\"a\": [1, {\"b\": null}]}").ok());
}

TEST_CASE("json text: a million-deep safetensors header, state.json or config.json is refused by name", "[json][checkpoint][hf][cli]") {
  const std::string deep(1000000, '[');
  std::string st(8, '\0');
  for (int i = 0; i < 8; ++i) st[i] = static_cast<char>((uint64_t(deep.size()) >> (8 * i)) & 0xff);
  auto header = parseSafetensors("m.safetensors", st + deep);
  REQUIRE_FALSE(header.ok());
  CHECK(header.error() ==
        "m.safetensors: error: not a valid safetensors file: header is not JSON: nested deeper than 256 levels at byte 256");
  auto state = parseCheckpointState("{\"format\": " + deep, "state.json");
  REQUIRE_FALSE(state.ok());
  CHECK(state.error() == "state.json: error: not JSON: nested deeper than 256 levels at byte 266");
  // config.json through tpc import, which has no library of its own to call.
  test::TempDir dir;
  std::filesystem::create_directories(dir / "hf");
  test::writeFile(dir / "hf/config.json", deep);
  auto r = test::runCommand(test::tpcBinary() + " import --hf " + (dir / "hf") + " -o " + (dir / "m.fb"));
  CHECK(r.exitCode == 1);
  CHECK(r.err.find("config.json: error: not JSON: nested deeper than 256 levels at byte 256") != std::string::npos);
  CHECK(std::count(r.err.begin(), r.err.end(), '\n') == 1);
  CHECK_FALSE(std::filesystem::exists(dir / "m.fb"));
}

}  // namespace tpc
