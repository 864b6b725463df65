// RemoveOnSignal (ir/file_io.h): the signal handler that removes guarded temporary files reads each guarded path
// while other threads may release their guard and guard another path in the same slot.
#include <catch2/catch.hpp>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "ir/file_io.h"
#include "test_support.h"

namespace tpc {

TEST_CASE("RemoveOnSignal: a signal while another thread re-guards its slot removes no mix of two paths", "[file_io]") {
  test::TempDir dir;
  const std::string base = dir.path.string() + "/";
  constexpr size_t kName = 240;
  const std::string a = base + std::string(kName, 'a'), b = base + std::string(kName, 'b');
  // Every name a read of the slot torn between a and b could make, as a file the handler must never remove.
  std::vector<std::string> victims;
  for (size_t k = 1; k < kName; ++k) {
    victims.push_back(base + std::string(k, 'a') + std::string(kName - k, 'b'));
    victims.push_back(base + std::string(k, 'b') + std::string(kName - k, 'a'));
  }
  for (const std::string& v : victims) test::writeFile(v, "keep me");
  for (int attempt = 0; attempt < 1500; ++attempt) {
    pid_t pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      // SIGHUP: the test runner catches SIGINT and SIGTERM itself, so RemoveOnSignal leaves those alone here.
      RemoveOnSignal first(base + "first.tmp");
      struct sigaction now {};
      if (::sigaction(SIGHUP, nullptr, &now) != 0 || now.sa_handler == SIG_DFL || now.sa_handler == SIG_IGN) ::_exit(3);
      std::atomic<bool> started{false};
      std::thread([&] {
        started = true;
        for (bool flip = false;; flip = !flip) {  // four slots, each guarding a and b in turn
          RemoveOnSignal g1(flip ? a : b), g2(flip ? b : a), g3(flip ? a : b), g4(flip ? b : a);
        }
      }).detach();
      while (!started) {
      }
      for (std::atomic<int> spin = 0; spin < 2000 + 7 * (attempt % 1000); ++spin) {
      }
      ::raise(SIGHUP);  // handled on this thread while the other one re-guards its slot
      ::_exit(4);
    }
    int status = 0;
    REQUIRE(::waitpid(pid, &status, 0) == pid);
    INFO("attempt " << attempt);
    if (!WIFSIGNALED(status) || WTERMSIG(status) != SIGHUP)
      FAIL("the child did not die of SIGHUP: exit " << (WIFEXITED(status) ? WEXITSTATUS(status) : -1)
                                                    << " (3: RemoveOnSignal installed no SIGHUP handler)");
    for (const std::string& v : victims)
      if (!std::filesystem::exists(v)) FAIL("the handler removed " << v.substr(base.size()) << ", which no guard named");
  }
}

}  // namespace tpc
