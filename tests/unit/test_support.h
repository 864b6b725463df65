// Helpers shared by unit tests: paths into the source and build trees, running the tpc binary.
#pragma once

#include <string>

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

}  // namespace tpc::test
