// RemoveOnSignal and FileCommit (ir/file_io.h): the signal handler that removes guarded temporary files reads each
// guarded path while other threads may release their guard and guard another path in the same slot; files committed
// together are all replaced or none, whatever fails or whichever signal comes between them.
#include <catch2/catch.hpp>

#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <set>
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

namespace {

namespace fs = std::filesystem;

std::set<std::string> namesIn(const fs::path& dir) {
  std::set<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.insert(e.path().filename().string());
  return names;
}

// The HOST part of a staged name TARGET.tmp.HOST.PID.N.
std::string hostPart(const std::string& staged, const std::string& target) {
  const std::string rest = staged.substr(target.size() + 5);  // after ".tmp."
  const size_t pidDot = rest.rfind('.', rest.rfind('.') - 1);
  return rest.substr(0, pidDot);
}

// The child's end: how it exited, or which signal ended it.
int waitFor(pid_t pid) {
  int status = 0;
  REQUIRE(::waitpid(pid, &status, 0) == pid);
  return WIFEXITED(status) ? WEXITSTATUS(status) : WIFSIGNALED(status) ? 1000 + WTERMSIG(status) : -1;
}

struct HookReset {
  ~HookReset() {
    FileCommit::setStepHookForTesting(nullptr);
    FileCommit::setMoveAsideForTesting(false);
  }
};

// Waits (up to 10 s) until signal `sig`, sent to thread `tid` of this process, is no longer pending there: its
// handler has started on that thread. From /proc/self/task/TID/status's SigPnd mask (bit sig - 1).
bool handlerStarted(pid_t tid, int sig) {
  for (int i = 0; i < 10000; ++i) {
    const std::string status = test::readFile("/proc/self/task/" + std::to_string(tid) + "/status");
    const size_t at = status.find("SigPnd:");
    if (at == std::string::npos) return false;
    if (((std::stoull(status.substr(at + 7), nullptr, 16) >> (sig - 1)) & 1) == 0) return true;
    ::usleep(1000);
  }
  return false;
}

// The folder the hooks below work in, and which of two processes a hook runs in.
std::string gHookDir;
char gWho = 0;

}  // namespace

TEST_CASE("FileCommit: temporary names differ between calls and between processes", "[file_io]") {
  test::TempDir dir;
  const std::string target = dir / "data.bin";
  FileCommit a, b;
  const std::string mine = a.stage(target), again = b.stage(target);
  CHECK(mine != again);
  // PATH.tmp.HOST.PID.N, HOST without dots (the host name and its PID namespace).
  const std::string host = hostPart(mine, target);
  CHECK_FALSE(host.empty());
  CHECK(host.find('.') == std::string::npos);
  CHECK(mine.rfind(target + ".tmp." + host + "." + std::to_string(::getpid()) + ".", 0) == 0);
  int fds[2];
  REQUIRE(::pipe(fds) == 0);
  pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    FileCommit c;
    const std::string theirs = c.stage(target);
    ssize_t n = ::write(fds[1], theirs.data(), theirs.size());
    ::_exit(n == static_cast<ssize_t>(theirs.size()) ? 0 : 1);
  }
  ::close(fds[1]);
  std::string theirs;
  char buf[512];
  for (ssize_t n; (n = ::read(fds[0], buf, sizeof buf)) > 0;) theirs.append(buf, static_cast<size_t>(n));
  ::close(fds[0]);
  CHECK(waitFor(pid) == 0);
  CHECK(theirs.rfind(target + ".tmp.", 0) == 0);
  CHECK(theirs != mine);
  CHECK(theirs != again);
}

// Review: a SIGKILLed `tpc prepare` left its multi-gigabyte PREFIX.bin.tmp.PID.N behind for good, one per run.
TEST_CASE("FileCommit: staging removes the temporaries of this machine's processes that no longer run", "[file_io]") {
  test::TempDir dir;
  const std::string target = dir / "data.bin";
  const std::string host = hostPart(FileCommit().stage(dir / "probe"), dir / "probe");
  pid_t dead = fork();  // a PID that no longer runs: a child that exited and was reaped
  REQUIRE(dead >= 0);
  if (dead == 0) ::_exit(0);
  REQUIRE(waitFor(dead) == 0);
  const std::string base = target + ".tmp." + host + ".";
  const std::string deadFile = base + std::to_string(dead) + ".0", deadFolder = base + std::to_string(dead) + ".1",
                    live = base + std::to_string(::getppid()) + ".0", other = target + ".tmp.elsewhere." +
                                                                           std::to_string(dead) + ".0",
                    otherTarget = dir / "other.bin.tmp." + host + "." + std::to_string(dead) + ".0";
  // A user's files that only begin like a temporary are not ours.
  const std::string usersFile = base + std::to_string(dead) + ".orig", usersFolder = base + std::to_string(dead) + ".0.notes";
  for (const std::string& f : {deadFile, live, other, otherTarget, usersFile}) test::writeFile(f, "x");
  fs::create_directories(usersFolder);
  fs::create_directories(deadFolder);
  test::writeFile(deadFolder + "/model.safetensors", "x");
  FileCommit c;
  c.stage(target);
  CHECK_FALSE(fs::exists(deadFile));
  CHECK_FALSE(fs::exists(deadFolder));
  CHECK(fs::exists(live));         // its process runs
  CHECK(fs::exists(other));        // another machine's
  CHECK(fs::exists(otherTarget));  // another file's
  CHECK(fs::exists(usersFile));
  CHECK(fs::exists(usersFolder));
}

TEST_CASE("FileCommit: replaces every file, or none when a write fails", "[file_io]") {
  test::TempDir dir;
  HookReset reset;
  const bool aside = GENERATE(false, true);  // exchanged in one step, or (where that fails) moved aside first
  INFO((aside ? "moved aside" : "exchanged"));
  FileCommit::setMoveAsideForTesting(aside);
  test::writeFile(dir / "a", "old a");
  test::writeFile(dir / "b", "old b");
  {
    FileCommit commit;
    REQUIRE(commit.write(dir / "a", "new a").ok());
    REQUIRE(commit.write(dir / "b", "new b").ok());
    CHECK(test::readFile(dir / "a") == "old a");  // nothing moves before commit()
    REQUIRE(commit.commit().ok());
  }
  CHECK(test::readFile(dir / "a") == "new a");
  CHECK(test::readFile(dir / "b") == "new b");
  CHECK(namesIn(dir.path) == std::set<std::string>{"a", "b"});

  // The second file fails midway (a full disk: here a file size limit, in a child): the first stays old too, and
  // neither temporary is left.
  pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    ::signal(SIGXFSZ, SIG_IGN);  // a write past the limit fails with EFBIG instead of killing
    struct rlimit limit {4096, 4096};
    ::setrlimit(RLIMIT_FSIZE, &limit);
    int rc = 0;
    {
      FileCommit commit;
      if (!commit.write(dir / "a", "newer a").ok()) rc = 2;
      Status s = commit.write(dir / "b", std::string(100000, 'b'));
      if (s.ok()) rc = 3;
      else if (s.error().rfind((dir / "b") + ": error: ", 0) != 0) rc = 4;  // the error names the file
    }  // not committed: its temporaries go
    ::_exit(rc);
  }
  CHECK(waitFor(pid) == 0);
  CHECK(test::readFile(dir / "a") == "new a");
  CHECK(test::readFile(dir / "b") == "new b");
  CHECK(namesIn(dir.path) == std::set<std::string>{"a", "b"});
}

TEST_CASE("writeFileAtomically: a link is written through, a FIFO or device written into, neither replaced", "[file_io]") {
  // tpc sample --dump-logits LINK replaced the link with a file; --dump-logits /dev/stdout (as root) replaced the
  // system's /dev/stdout link, and a FIFO's reader got nothing.
  test::TempDir dir;
  test::writeFile(dir / "target", "old");
  std::filesystem::create_symlink("target", dir / "link");
  std::filesystem::create_symlink(dir / "link", dir / "link2");  // a chain, the last hop relative
  REQUIRE(writeFileAtomically(dir / "link2", "new").ok());
  CHECK(std::filesystem::is_symlink(dir / "link"));
  CHECK(std::filesystem::is_symlink(dir / "link2"));
  CHECK(test::readFile(dir / "target") == "new");
  CHECK(namesIn(dir.path) == std::set<std::string>{"link", "link2", "target"});
  // A dangling link makes its target.
  std::filesystem::create_symlink("made", dir / "dangling");
  REQUIRE(writeFileAtomically(dir / "dangling", "made").ok());
  CHECK(std::filesystem::is_symlink(dir / "dangling"));
  CHECK(test::readFile(dir / "made") == "made");

  const std::string fifo = dir / "fifo";
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  CHECK(isStreamFile(fifo));
  CHECK_FALSE(isStreamFile(dir / "target"));
  std::string got;
  std::thread reader([&] { got = test::readFile(fifo); });
  REQUIRE(writeFileAtomically(fifo, std::vector<std::string_view>{"through ", "the pipe"}).ok());
  reader.join();
  CHECK(got == "through the pipe");
  CHECK(isStreamFile(fifo));
  // /dev/fd/N (and /dev/stdout, /proc/self/fd/N) is written through the open file it names, appended as the shell's
  // >> does: the file a shell redirected to is not replaced by a new one (whose bytes the shell's own would never see).
  test::writeFile(dir / "log", "earlier\n");
  const int fd = ::open((dir / "log").c_str(), O_WRONLY | O_APPEND);
  REQUIRE(fd >= 0);
  struct stat before, after;
  REQUIRE(::stat((dir / "log").c_str(), &before) == 0);
  REQUIRE(writeFileAtomically("/dev/fd/" + std::to_string(fd), "later\n").ok());
  ::close(fd);
  REQUIRE(::stat((dir / "log").c_str(), &after) == 0);
  CHECK(after.st_ino == before.st_ino);
  CHECK(test::readFile(dir / "log") == "earlier\nlater\n");
  // A loop of links is an error, not a link replaced.
  std::filesystem::create_symlink("loop2", dir / "loop1");
  std::filesystem::create_symlink("loop1", dir / "loop2");
  Status loop = writeFileAtomically(dir / "loop1", "x");
  REQUIRE_FALSE(loop.ok());
  CHECK(loop.error() == dir / "loop1" + ": error: too many levels of symbolic links (a loop?); name the file itself");
  CHECK(std::filesystem::is_symlink(dir / "loop1"));
  // A device that refuses the bytes is the write's error.
  if (std::filesystem::exists("/dev/full")) {
    Status full = writeFileAtomically("/dev/full", "x");
    REQUIRE_FALSE(full.ok());
    CHECK(full.error() == "/dev/full: error: write failed: No space left on device");
  }
}

TEST_CASE("FileCommit: a folder in the way of the second file is refused before the first is replaced", "[file_io]") {
  test::TempDir dir;
  test::writeFile(dir / "a", "old a");
  fs::create_directories(dir / "b/inside");
  test::writeFile(dir / "b/inside/keep", "mine");
  FileCommit commit;
  REQUIRE(commit.write(dir / "a", "new a").ok());
  REQUIRE(commit.write(dir / "b", "new b").ok());
  Status s = commit.commit();
  REQUIRE_FALSE(s.ok());
  CHECK(s.error() == (dir / "b") + ": error: is a folder where a file is written; remove it or name another");
  CHECK(test::readFile(dir / "a") == "old a");
  CHECK(test::readFile(dir / "b/inside/keep") == "mine");
  CHECK(namesIn(dir.path) == std::set<std::string>{"a", "b"});
}

TEST_CASE("FileCommit: a rename that fails midway puts back the files already replaced", "[file_io]") {
  test::TempDir dir;
  HookReset reset;
  const bool aside = GENERATE(false, true);  // exchanged in one step, or (where that fails) moved aside first
  INFO((aside ? "moved aside" : "exchanged"));
  FileCommit::setMoveAsideForTesting(aside);
  for (const char* n : {"a", "b", "c"}) test::writeFile(dir / n, std::string("old ") + n);
  gHookDir = dir.path.string();
  // Before the third rename, its temporary vanishes: the rename fails after a and b were replaced.
  FileCommit::setStepHookForTesting([](size_t step) {
    if (step != 2) return;
    for (const auto& e : fs::directory_iterator(gHookDir))
      if (e.path().filename().string().rfind("c.tmp.", 0) == 0) fs::remove(e.path());
  });
  FileCommit commit;
  for (const char* n : {"a", "b", "c"}) REQUIRE(commit.write(dir / n, std::string("new ") + n).ok());
  Status s = commit.commit();
  REQUIRE_FALSE(s.ok());
  CHECK_THAT(s.error(), Catch::StartsWith((dir / "c") + ": error: cannot move into place: "));
  for (const char* n : {"a", "b", "c"}) CHECK(test::readFile(dir / n) == std::string("old ") + n);
  CHECK(namesIn(dir.path) == std::set<std::string>{"a", "b", "c"});

  // A commit of new files only: on failure none of them is left.
  fs::remove_all(dir.path / "a"), fs::remove_all(dir.path / "b"), fs::remove_all(dir.path / "c");
  FileCommit fresh;
  for (const char* n : {"a", "b", "c"}) REQUIRE(fresh.write(dir / n, "new").ok());
  REQUIRE_FALSE(fresh.commit().ok());
  CHECK(fs::is_empty(dir.path));
}

TEST_CASE("FileCommit: a signal between two renames ends the process after the last one", "[file_io]") {
  test::TempDir dir;
  HookReset reset;
  for (bool otherThread : {false, true}) {
    INFO((otherThread ? "the signal handled on another thread" : "the signal sent to the committing thread"));
    test::writeFile(dir / "a", "old a");
    test::writeFile(dir / "b", "old b");
    pid_t pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      // SIGHUP: the test runner catches SIGINT and SIGTERM itself, so RemoveOnSignal leaves those alone here.
      static pthread_t other;
      static std::atomic<pid_t> otherTid{0};
      static bool toOther;
      toOther = otherThread;
      std::atomic<bool> stop{false};
      std::thread idle([&] {
        otherTid = static_cast<pid_t>(::gettid());
        while (!stop) ::usleep(1000);
      });
      other = idle.native_handle();
      while (otherTid == 0) ::usleep(1000);
      FileCommit::setStepHookForTesting([](size_t step) {
        if (step != 1) return;
        // On another thread (which does not block it), the handler runs at once and must wait for the commit: the
        // second rename goes on only once the handler is known to have started, and some time after.
        if (toOther) {
          ::pthread_kill(other, SIGHUP);
          if (!handlerStarted(otherTid, SIGHUP)) ::_exit(4);
          ::usleep(50000);
        } else {
          ::raise(SIGHUP);
        }
      });
      FileCommit commit;
      if (!commit.write(dir / "a", "new a").ok() || !commit.write(dir / "b", "new b").ok()) ::_exit(2);
      Status s = commit.commit();
      ::usleep(500000);  // (a signal still on its way to the other thread, on a loaded machine, lands here)
      ::_exit(s.ok() ? 0 : 3);  // reached only if the signal was lost
    }
    CHECK(waitFor(pid) == 1000 + SIGHUP);
    CHECK(test::readFile(dir / "a") == "new a");
    CHECK(test::readFile(dir / "b") == "new b");
    CHECK(namesIn(dir.path) == std::set<std::string>{"a", "b"});
  }
}

TEST_CASE("FileCommit: two processes committing the same files leave one's pair, not a mix", "[file_io]") {
  test::TempDir dir;
  HookReset reset;
  for (int round = 0; round < 5; ++round) {
    int go[2];
    REQUIRE(::pipe(go) == 0);
    std::vector<pid_t> pids;
    for (char who : {'x', 'y'}) {
      pid_t pid = fork();
      REQUIRE(pid >= 0);
      if (pid == 0) {
        ::close(go[1]);
        char c;
        if (::read(go[0], &c, 1) != 0) ::_exit(2);  // both start when the parent closes the pipe
        // x waits between its two renames, y before its first: without the lock, y's pair lands between x's a and
        // x's b (a of y, b of x).
        gWho = who;
        FileCommit::setStepHookForTesting([](size_t step) { ::usleep(step == (gWho == 'x' ? 1 : 0) ? 100000 : 0); });
        FileCommit commit;
        if (!commit.write(dir / "a", std::string("a of ") + who).ok()) ::_exit(3);
        if (!commit.write(dir / "b", std::string("b of ") + who).ok()) ::_exit(3);
        ::_exit(commit.commit().ok() ? 0 : 4);
      }
      pids.push_back(pid);
    }
    ::close(go[0]);
    ::close(go[1]);
    for (pid_t pid : pids) CHECK(waitFor(pid) == 0);
    const std::string a = test::readFile(dir / "a"), b = test::readFile(dir / "b");
    INFO("round " << round << ": " << a << ", " << b);
    CHECK((a == "a of x" || a == "a of y"));
    CHECK(b.substr(5) == a.substr(5));
    CHECK(namesIn(dir.path) == std::set<std::string>{"a", "b"});
  }
}

TEST_CASE("RemoveOnSignal: a guarded folder of files is removed by the signal", "[file_io]") {
  test::TempDir dir;
  const std::string folder = dir / "iter_0000000.tmp.1.0";
  fs::create_directory(folder);
  for (const char* n : {"model.safetensors", "state.json", "model.fb"}) test::writeFile(folder + "/" + n, n);
  pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    RemoveOnSignal guard(folder);
    ::raise(SIGHUP);
    ::_exit(2);
  }
  CHECK(waitFor(pid) == 1000 + SIGHUP);
  CHECK(fs::is_empty(dir.path));
}

}  // namespace tpc
