// Atomic file output.
#include "ir/file_io.h"

#include <limits.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <mutex>

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

void removeGuardedFiles(int sig) {
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
        ::unlink(path);
        break;
      }
    }
  // Then the default action, as if never caught: the process ends by the signal and its exit status says so.
  ::signal(sig, SIG_DFL);
  ::raise(sig);
}

void installSignalCleanup() {
  static std::once_flag once;
  std::call_once(once, [] {
    for (int sig : {SIGINT, SIGTERM, SIGHUP}) {
      struct sigaction old {};
      if (::sigaction(sig, nullptr, &old) != 0 || old.sa_handler != SIG_DFL) continue;  // ignored, or another's
      struct sigaction sa {};
      sa.sa_handler = removeGuardedFiles;
      sigemptyset(&sa.sa_mask);
      ::sigaction(sig, &sa, nullptr);
    }
  });
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
  std::string tmp = path + ".tmp";
  RemoveOnSignal guard(tmp);
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    if (!f) return makeError(path, ": error: cannot write: ", std::strerror(errno));
    for (std::string_view piece : pieces) f.write(piece.data(), static_cast<std::streamsize>(piece.size()));
    f.flush();
    if (!f) {
      std::remove(tmp.c_str());
      return makeError(path, ": error: write failed: ", std::strerror(errno));
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    return makeError(path, ": error: cannot rename into place: ", std::strerror(errno));
  }
  return {};
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
