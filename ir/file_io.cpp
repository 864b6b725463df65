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
// (unlink, signal, raise) and read lock-free atomics.
struct GuardSlot {
  enum State : int { Free, Filling, Armed };
  std::atomic<int> state{Free};
  char path[PATH_MAX];
};
constexpr int kGuardSlots = 16;
GuardSlot gGuards[kGuardSlots];
static_assert(std::atomic<int>::is_always_lock_free);

void removeGuardedFiles(int sig) {
  for (GuardSlot& g : gGuards)
    if (g.state.load() == GuardSlot::Armed) ::unlink(g.path);
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
    int expected = GuardSlot::Free;
    if (!gGuards[i].state.compare_exchange_strong(expected, GuardSlot::Filling)) continue;
    std::memcpy(gGuards[i].path, path.c_str(), path.size() + 1);
    gGuards[i].state.store(GuardSlot::Armed);
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
  if (slot_ >= 0) gGuards[slot_].state.store(GuardSlot::Free);
  slot_ = -1;
}

Status writeFileAtomically(const std::string& path, std::string_view contents) {
  return writeFileAtomically(path, std::span<const std::string_view>(&contents, 1));
}

Status writeFileAtomically(const std::string& path, std::span<const std::string_view> pieces) {
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
