// Helpers shared by unit tests.
#include "test_support.h"

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <sstream>

namespace tpc::test {

std::string readFile(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

CommandResult runTiny(const std::string& args) {
  return runCommand(tpcBinary() + " run " + binaryPath("models/tiny.fb") + " --threads 2 --log-interval 1 " + args);
}

std::vector<double> jsonlField(const std::string& jsonl, const std::string& key) {
  std::vector<double> out;
  std::istringstream in(jsonl);
  std::string line;
  while (std::getline(in, line)) {
    auto k = line.find("\"" + key + "\": ");
    if (k != std::string::npos) out.push_back(std::stod(line.substr(k + key.size() + 4)));
  }
  return out;
}

CommandResult runCommand(const std::string& commandLine, const std::string& stdinText) {
  char outName[] = "/tmp/tpc_test_outXXXXXX", errName[] = "/tmp/tpc_test_errXXXXXX", inName[] = "/tmp/tpc_test_inXXXXXX";
  int fo = mkstemp(outName), fe = mkstemp(errName), fi = mkstemp(inName);
  close(fo);
  close(fe);
  if (write(fi, stdinText.data(), stdinText.size()) < 0) {}
  close(fi);
  std::string cmd = "(" + commandLine + ") <" + inName + " >" + outName + " 2>" + errName;
  int status = std::system(cmd.c_str());
  CommandResult r;
  r.exitCode = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  r.out = readFile(outName);
  r.err = readFile(errName);
  unlink(outName);
  unlink(errName);
  unlink(inName);
  return r;
}

}  // namespace tpc::test
