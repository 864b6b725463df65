// Helpers shared by unit tests: paths into the source and build trees, running the tpc binary.
#pragma once

#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace tpc::test {

inline std::string sourcePath(const std::string& rel) { return std::string(TPC_TEST_SOURCE_DIR) + "/" + rel; }
inline std::string binaryPath(const std::string& rel) { return std::string(TPC_TEST_BINARY_DIR) + "/" + rel; }
inline std::string tpcBinary() { return binaryPath("bin/tpc"); }

struct CommandResult {
  int exitCode = -1;
  std::string out;  // stdout
  std::string err;  // stderr
};
// Runs a shell command line, capturing stdout and stderr separately.
CommandResult runCommand(const std::string& commandLine, const std::string& stdinText = "");
// Reads a whole file ("" if it cannot be read).
std::string readFile(const std::string& path);
// `tpc run` on models/tiny.fb with 2 threads, logging every step, and `args`.
CommandResult runTiny(const std::string& args);
// The values of "key": NUMBER on each line of a JSONL log (`tpc run --log-jsonl`) that has it, in order.
std::vector<double> jsonlField(const std::string& jsonl, const std::string& key);

// A model file's JSON (tpc new -o M.json) without its arch block: a graph of its own, which tpc cannot rebuild.
// Empty when the text has no arch block.
inline std::string withoutArchBlock(const std::string& json) {
  const size_t arch = json.find(",\n  \"arch_type\"");
  return arch == std::string::npos ? std::string() : json.substr(0, arch) + "\n}\n";
}

inline void writeFile(const std::string& path, const std::string& content) {
  std::ofstream(path, std::ios::binary) << content;
}

// A fresh directory under /tmp, removed with everything in it at the end of the scope.
struct TempDir {
  std::filesystem::path path;
  TempDir() {
    char tmpl[] = "/tmp/tpc_test_XXXXXX";
    path = mkdtemp(tmpl);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  std::string operator/(const std::string& name) const { return (path / name).string(); }
};

}  // namespace tpc::test
