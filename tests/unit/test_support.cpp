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
