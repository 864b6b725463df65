// Atomic file output.
#include "ir/file_io.h"

#include <dirent.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <mutex>
#include <set>

namespace tpc {

namespace {

// The guarded paths, in fixed storage the signal handler can read: it may only call async-signal-safe functions
// (unlink, signal, raise) and read lock-free atomics. A slot's word holds its state in the low bits and, above
// them, how often it was filled: while the handler reads a path on one thread, another thread may release its
// guard and guard another path in that slot, so the handler unlinks its copy of the path only if the word did not
// change meanwhile (a copy torn between two paths names a third file, which may exist).
struct GuardSlot {
  enum State : unsigned { Free, Filling, Armed };
  static constexpr unsigned kStateMask = 3, kFilled = 4;
  std::atomic<unsigned> word{Free};
  char path[PATH_MAX];
};
constexpr int kGuardSlots = 16;
GuardSlot gGuards[kGuardSlots];
static_assert(std::atomic<unsigned>::is_always_lock_free);

// How many FileCommits are renaming now, and a signal that came meanwhile on a thread that did not block it: it ends
// the process when the last commit is done, not between two renames. gHandlersActive counts the handlers running
// now: a commit starts its renames only when none is, so that a handler that found no commit running does not
// remove the temporaries and end the process while a commit that started after its check renames.
std::atomic<int> gCommitsRunning{0};
std::atomic<int> gDeferredSignal{0};
std::atomic<int> gHandlersActive{0};
// Set by the handler before it gives the signal back to its default action to end the process: from then on no guard
// installs the handler again (a guard made on another thread meanwhile would turn the ending signal into another call
// of the handler on that thread, while this one returns and goes on).
std::atomic<bool> gTerminating{false};
static_assert(std::atomic<int>::is_always_lock_free);

// unlink, or for a folder (a staged checkpoint) its files and then the folder: only system calls, as a signal handler
// may make (getdents64 rather than readdir, which allocates).
void removeFileOrFlatFolder(const char* path) {
  if (::unlink(path) == 0 || (errno != EISDIR && errno != EPERM)) return;
  int fd = ::open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;
  alignas(8) char buf[4096];
  for (long n; (n = ::syscall(SYS_getdents64, fd, buf, sizeof buf)) > 0;)
    for (long at = 0; at < n;) {
      // struct linux_dirent64: u64 ino, s64 off, u16 reclen, u8 type, char name[]
      unsigned short reclen;
      std::memcpy(&reclen, buf + at + 16, sizeof reclen);
      const char* name = buf + at + 19;
      if (std::strcmp(name, ".") != 0 && std::strcmp(name, "..") != 0) ::unlinkat(fd, name, 0);
      at += reclen;
    }
  ::close(fd);
  ::rmdir(path);
}

void removeGuardedFiles(int sig) {
  ++gHandlersActive;
  // The signal is recorded first: a commit ending between this store and the check below delivers it itself (its
  // exchange finds it), and then this handler's exchange finds 0 and leaves it to that commit. Exactly one of them
  // takes it, so none is lost.
  gDeferredSignal.store(sig);
  if (gCommitsRunning.load() > 0 || gDeferredSignal.exchange(0) == 0) {
    --gHandlersActive;
    return;
  }
  for (GuardSlot& g : gGuards)
    for (int tries = 0; tries < 8; ++tries) {  // a slot re-filled during the copy holds a file too: copy it again
      const unsigned before = g.word.load(std::memory_order_acquire);
      if ((before & GuardSlot::kStateMask) != GuardSlot::Armed) break;
      char path[PATH_MAX];
      const volatile char* from = g.path;
      size_t n = 0;
      while (n + 1 < sizeof path && (path[n] = from[n]) != '\0') ++n;
      path[n] = '\0';
      std::atomic_thread_fence(std::memory_order_acquire);
      if (g.word.load(std::memory_order_relaxed) == before) {
        removeFileOrFlatFolder(path);
        break;
      }
    }
  // Then the default action, as if never caught: the process ends by the signal and its exit status says so. Sent to
  // the process, not this thread, which may block it (a commit's end calls this directly); should it come back
  // (every thread blocks the signal), no commit may wait on this handler.
  gTerminating = true;
  ::signal(sig, SIG_DFL);
  ::kill(::getpid(), sig);
  --gHandlersActive;
}

// Looked at again for every guard, not once: another handler (tpc run --exit-signal-handler) may have given a signal
// back to the default action since.
void installSignalCleanup() {
  for (int sig : {SIGINT, SIGTERM, SIGHUP}) {
    struct sigaction old {};
    if (::sigaction(sig, nullptr, &old) != 0 || old.sa_handler != SIG_DFL) continue;  // ignored, ours, or another's
    if (gTerminating) return;  // the default action was given back to end the process (read after the action)
    struct sigaction sa {};
    sa.sa_handler = removeGuardedFiles;
    sa.sa_flags = SA_RESTART;  // a write the signal interrupts on another thread goes on (stdio does not retry EINTR)
    sigemptyset(&sa.sa_mask);
    ::sigaction(sig, &sa, nullptr);
  }
}

}  // namespace

RemoveOnSignal::RemoveOnSignal(const std::string& path) {
  if (path.empty() || path.size() >= PATH_MAX) return;
  installSignalCleanup();
  for (int i = 0; i < kGuardSlots; ++i) {
    GuardSlot& g = gGuards[i];
    unsigned word = g.word.load();
    if ((word & GuardSlot::kStateMask) != GuardSlot::Free) continue;
    const unsigned filled = (word & ~GuardSlot::kStateMask) + GuardSlot::kFilled;
    if (!g.word.compare_exchange_strong(word, filled | GuardSlot::Filling)) continue;
    std::memcpy(g.path, path.c_str(), path.size() + 1);
    g.word.store(filled | GuardSlot::Armed, std::memory_order_release);
    slot_ = i;
    return;
  }
}

RemoveOnSignal& RemoveOnSignal::operator=(RemoveOnSignal&& o) noexcept {
  if (this != &o) {
    release();
    slot_ = std::exchange(o.slot_, -1);
  }
  return *this;
}

void RemoveOnSignal::release() {
  if (slot_ >= 0) gGuards[slot_].word.fetch_and(~GuardSlot::kStateMask);  // Free, the fill count kept
  slot_ = -1;
}

Status writeFileAtomically(const std::string& path, std::string_view contents) {
  return writeFileAtomically(path, std::vector<std::string_view>{contents});
}

Status writeFileAtomically(const std::string& path, const std::vector<std::string_view>& pieces) {
  FileCommit commit;
  TPC_TRY(commit.write(path, pieces));
  return commit.commit();
}

namespace {

FileCommit::StepHook gStepHook = nullptr;
bool gMoveAside = false;

// Holds SIGINT, SIGTERM and SIGHUP off while it lives: blocked on this thread, deferred by removeGuardedFiles on
// any other. Its end delivers one that came meanwhile.
class SignalsHeld {
 public:
  SignalsHeld() {
    sigset_t set;
    sigemptyset(&set);
    for (int sig : {SIGINT, SIGTERM, SIGHUP}) sigaddset(&set, sig);
    ::pthread_sigmask(SIG_BLOCK, &set, &old_);
    ++gCommitsRunning;
    // A handler already past its check on another thread ends the process (this commit has renamed nothing) or
    // returns soon: wait for it.
    while (gHandlersActive.load() > 0) ::sched_yield();
  }
  SignalsHeld(const SignalsHeld&) = delete;
  SignalsHeld& operator=(const SignalsHeld&) = delete;
  ~SignalsHeld() {
    const bool last = --gCommitsRunning == 0;
    ::pthread_sigmask(SIG_SETMASK, &old_, nullptr);  // one pending on this thread is handled here
    if (int sig = last ? gDeferredSignal.exchange(0) : 0) removeGuardedFiles(sig);
  }

 private:
  sigset_t old_;
};

// An exclusive flock on each folder, taken in one order (by name) so that two commits never wait on each other.
// Best effort: a file system without flock (some network ones) commits unlocked.
class FolderLocks {
 public:
  explicit FolderLocks(const std::set<std::string>& folders) {
    for (const std::string& f : folders) {
      int fd = ::open(f.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
      if (fd < 0) continue;
      while (::flock(fd, LOCK_EX) != 0 && errno == EINTR) {
      }
      fds_.push_back(fd);
    }
  }
  FolderLocks(const FolderLocks&) = delete;
  FolderLocks& operator=(const FolderLocks&) = delete;
  ~FolderLocks() {
    for (int fd : fds_) ::close(fd);  // closing releases the lock
  }

 private:
  std::vector<int> fds_;
};

std::string folderOf(const std::string& path) {
  std::filesystem::path parent = std::filesystem::path(path).parent_path();
  return parent.empty() ? "." : parent.string();
}

// What is at `path`: 0 nothing, 1 a file (or a link, which rename replaces as a file), 2 a folder.
int kindAt(const std::string& path) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) return 0;
  return S_ISDIR(st.st_mode) ? 2 : 1;
}

void removeAll(const std::string& path) {
  std::error_code ec;
  std::filesystem::remove_all(path, ec);
}

}  // namespace

FileCommit& FileCommit::operator=(FileCommit&& o) noexcept {
  if (this != &o) {
    discard();
    entries_ = std::exchange(o.entries_, {});
  }
  return *this;
}

void FileCommit::setStepHookForTesting(StepHook hook) { gStepHook = hook; }
void FileCommit::setMoveAsideForTesting(bool on) { gMoveAside = on; }

// PATH.tmp.HOST.PID.N temporaries of PATH left by processes of this machine that no longer run (killed by SIGKILL or
// the OOM killer, which no handler sees): removed, so that they do not pile up (a dataset's is gigabytes). Another
// machine's, on a shared file system, are left alone: its PIDs mean nothing here.
void removeStaleTemporaries(const std::string& path, const std::string& host) {
  const std::string folder = folderOf(path), prefix = std::filesystem::path(path).filename().string() + ".tmp." + host + ".";
  std::error_code ec;
  for (std::filesystem::directory_iterator it(folder, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.compare(0, prefix.size(), prefix) != 0) continue;
    // Exactly PATH.tmp.HOST.PID.N, digits only: a user's "data.bin.tmp.HOST.12.orig" is not ours.
    char* stop = nullptr;
    const long pid = std::strtol(name.c_str() + prefix.size(), &stop, 10);
    if (pid <= 0 || *stop != '.' || pid == ::getpid() || stop[1] == '\0' ||
        std::strspn(stop + 1, "0123456789") != std::strlen(stop + 1))
      continue;
    if (::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH) removeAll(it->path().string());
  }
}

std::string FileCommit::stage(const std::string& path) {
  static std::atomic<unsigned long> counter{0};
  // The host and its PID namespace (containers on the host's name have PIDs of their own): a PID in a name is only
  // looked up where it means the same process.
  static const std::string host = [] {
    char h[256] = "host";
    ::gethostname(h, sizeof h - 1);
    std::string s = h;
    char ns[64] = {0};
    if (::readlink("/proc/self/ns/pid", ns, sizeof ns - 1) > 0) {  // "pid:[4026531836]"
      const char* digits = std::strchr(ns, '[');
      if (digits) s += "-" + std::string(digits + 1, std::strcspn(digits + 1, "]"));
    }
    std::replace(s.begin(), s.end(), '/', '_');
    std::replace(s.begin(), s.end(), '.', '_');  // no dot inside the host part: the name splits at dots
    return s;
  }();
  removeStaleTemporaries(path, host);
  Entry e;
  e.path = path;
  e.tmp = path + ".tmp." + host + "." + std::to_string(::getpid()) + "." + std::to_string(counter++);
  e.guard = RemoveOnSignal(e.tmp);
  entries_.push_back(std::move(e));
  return entries_.back().tmp;
}

Status FileCommit::write(const std::string& path, std::string_view contents) {
  return write(path, std::vector<std::string_view>{contents});
}

namespace {
// /proc/PID/fd/N and /dev/fd/N (where /dev/stdout leads): their last hop names an open file of this process (a pipe,
// or the file a shell redirected to), opened through the link itself, never replaced.
bool isDescriptorLink(const std::string& p) { return p.rfind("/proc/", 0) == 0 || p.rfind("/dev/fd/", 0) == 0; }
}  // namespace

std::string outputTarget(const std::string& path) {
  std::filesystem::path p = path;
  std::error_code ec;
  for (int hops = 0; hops < 40 && std::filesystem::is_symlink(std::filesystem::symlink_status(p, ec)) &&
                     !isDescriptorLink(p.string()) && !isStreamFile(p.string());
       ++hops) {
    std::filesystem::path to = std::filesystem::read_symlink(p, ec);
    if (ec) break;
    p = to.is_absolute() ? to : p.parent_path() / to;
  }
  return p.string();
}

bool isStreamFile(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && (S_ISFIFO(st.st_mode) || S_ISCHR(st.st_mode) || S_ISBLK(st.st_mode) ||
                                            S_ISSOCK(st.st_mode));
}

bool writtenInPlace(const std::string& target) { return isStreamFile(target) || isDescriptorLink(target); }

bool truncatableFile(const std::string& path) {
  const std::string target = outputTarget(path);
  std::error_code ec;
  return !writtenInPlace(target) && std::filesystem::is_regular_file(target, ec);
}

Status FileCommit::write(const std::string& given, const std::vector<std::string_view>& pieces) {
  const std::string path = outputTarget(given);
  if (writtenInPlace(path)) {  // written now, appended as a shell's >> would: nothing to replace atomically
    std::ofstream f(path, std::ios::binary | std::ios::app);
    for (std::string_view piece : pieces)
      if (f) f.write(piece.data(), static_cast<std::streamsize>(piece.size()));
    f.flush();
    if (!f) return makeError(given, ": error: write failed: ", std::strerror(errno));
    return {};
  }
  std::error_code ec;
  if (std::filesystem::is_symlink(std::filesystem::symlink_status(path, ec)))
    return makeError(given, ": error: too many levels of symbolic links (a loop?); name the file itself");
  const std::string tmp = stage(path);
  std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
  if (!f) {
    Error e = makeError(path, ": error: cannot write: ", std::strerror(errno));
    entries_.pop_back();
    return e;
  }
  for (std::string_view piece : pieces) f.write(piece.data(), static_cast<std::streamsize>(piece.size()));
  f.flush();
  if (!f) {
    Error e = makeError(path, ": error: write failed: ", std::strerror(errno));
    f.close();
    std::remove(tmp.c_str());
    entries_.pop_back();
    return e;
  }
  return {};
}

void FileCommit::discard() {
  for (Entry& e : entries_) removeAll(e.tmp);
  entries_.clear();  // the guards go with them
}

Status FileCommit::commit() {
  // A folder where a file goes (or the reverse) is refused before anything moves: a rename would fail midway, and an
  // exchange would succeed and put the user's folder where the old copy is removed.
  for (const Entry& e : entries_) {
    const int now = kindAt(e.path), next = kindAt(e.tmp);
    if (next == 0) {
      Error err = makeError(e.path, ": error: cannot move into place: its temporary ", e.tmp, " is missing");
      discard();
      return err;
    }
    if (now != 0 && now != next) {
      Error err = makeError(e.path, now == 2 ? ": error: is a folder where a file is written; remove it or name another"
                                            : ": error: is a file where a folder is written; remove it or name another");
      discard();
      return err;
    }
  }
  std::set<std::string> folders;
  for (const Entry& e : entries_) folders.insert(folderOf(e.path));
  FolderLocks locks(folders);
  // Where each entry's old copy went, for putting it back or removing it.
  enum Moved { NotYet, Fresh, Exchanged, Aside };
  std::vector<Moved> moved(entries_.size(), NotYet);
  std::vector<std::string> aside(entries_.size());
  Status failed;
  // Tests of the tools, which run in a process of their own: TPC_TEST_SIGINT_AFTER_RENAME=NAME raises SIGINT right
  // after a file named NAME is moved into place, as a Ctrl-C there would.
  const char* interruptAfter = std::getenv("TPC_TEST_SIGINT_AFTER_RENAME");
  {
    SignalsHeld held;
    for (size_t i = 0; i < entries_.size(); ++i) {
      const Entry& e = entries_[i];
      if (gStepHook) gStepHook(i);
      // The old copy swaps places with the new one in one step, so `path` never goes missing; where the file system
      // cannot exchange, it is moved aside first.
      const bool replacing = kindAt(e.path) != 0;
      if (!replacing) {
        if (std::rename(e.tmp.c_str(), e.path.c_str()) == 0) moved[i] = Fresh;
      } else if (!gMoveAside && ::renameat2(AT_FDCWD, e.tmp.c_str(), AT_FDCWD, e.path.c_str(), RENAME_EXCHANGE) == 0) {
        moved[i] = Exchanged;
      } else if (gMoveAside || errno == EINVAL || errno == ENOSYS || errno == EOPNOTSUPP) {
        aside[i] = e.tmp + ".old";
        if (std::rename(e.path.c_str(), aside[i].c_str()) == 0) {
          if (std::rename(e.tmp.c_str(), e.path.c_str()) == 0) {
            moved[i] = Aside;
          } else {
            const int err = errno;
            std::rename(aside[i].c_str(), e.path.c_str());
            errno = err;
          }
        }
      }
      if (moved[i] != NotYet) {
        if (interruptAfter && std::filesystem::path(e.path).filename() == interruptAfter) ::raise(SIGINT);
        continue;
      }
      const int err = errno;
      failed = makeError(e.path, ": error: cannot move into place: ", std::strerror(err));
      break;
    }
    if (!failed.ok()) {
      // Put back, newest first, what the renames before the failed one replaced.
      for (size_t i = entries_.size(); i-- > 0;) {
        const Entry& e = entries_[i];
        if (moved[i] == Exchanged) {
          ::renameat2(AT_FDCWD, e.tmp.c_str(), AT_FDCWD, e.path.c_str(), RENAME_EXCHANGE);
        } else if (moved[i] == Fresh) {
          std::rename(e.path.c_str(), e.tmp.c_str());
        } else if (moved[i] == Aside) {
          std::rename(e.path.c_str(), e.tmp.c_str());
          std::rename(aside[i].c_str(), e.path.c_str());
        }
      }
    }
    // The old copies (now at the temporary names) and the temporaries of a failed commit, removed before the
    // guards go and a held signal may end the process.
    for (size_t i = 0; i < entries_.size(); ++i) {
      removeAll(entries_[i].tmp);
      if (moved[i] == Aside && failed.ok()) removeAll(aside[i]);  // (put back when it failed)
    }
    entries_.clear();
  }
  return failed;
}

std::filesystem::path firstMissingFolder(const std::filesystem::path& path) {
  std::error_code ec;
  std::filesystem::path missing;
  for (std::filesystem::path p = std::filesystem::absolute(path, ec);
       !ec && p.has_relative_path() && !std::filesystem::exists(p, ec); p = p.parent_path())
    missing = p;
  return missing;
}

}  // namespace tpc
