// Read-only mmap of a whole file.
#include "frontend/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstring>
#include <mutex>
#include <utility>

namespace tpc {
namespace {

// The live mappings, for the SIGBUS handler to name the file a fault is in. Slots are claimed under a mutex and
// published by their `begin` (release); the handler only reads (acquire), as a signal handler may.
struct Mapping {
  std::atomic<const uint8_t*> begin{nullptr};
  size_t size = 0;
  char path[480] = {};
};
constexpr int kMappings = 256;
Mapping mappings[kMappings];
std::mutex mappingsLock;
struct sigaction previousBusAction;

void writeAll(const char* s) {
  for (size_t n = std::strlen(s); n > 0;) {
    ssize_t w = ::write(STDERR_FILENO, s, n);
    if (w <= 0) return;
    s += w, n -= static_cast<size_t>(w);
  }
}

void onBusError(int sig, siginfo_t* info, void* context) {
  const auto* at = static_cast<const uint8_t*>(info->si_addr);
  for (Mapping& m : mappings) {
    if (info->si_code <= 0) break;  // sent by kill or raise: si_addr is not an address
    const uint8_t* b = m.begin.load(std::memory_order_acquire);
    if (!b || at < b || at >= b + m.size) continue;
    writeAll("tpc: error: ");
    writeAll(m.path);
    writeAll(" could not be read (it shrank: truncated or rewritten during the run, or the disk failed); restore "
             "the file and run again, and make new data under another name\n");
    _exit(1);
  }
  // Not a mapping of ours: what would have happened without this handler.
  if (previousBusAction.sa_flags & SA_SIGINFO) {
    if (previousBusAction.sa_sigaction) return previousBusAction.sa_sigaction(sig, info, context);
  } else if (previousBusAction.sa_handler != SIG_DFL && previousBusAction.sa_handler != SIG_IGN) {
    return previousBusAction.sa_handler(sig);
  }
  // The signal is blocked in here: raised again, it ends the process as SIGBUS does once the handler returns.
  signal(SIGBUS, SIG_DFL);
  raise(SIGBUS);
}

void addMapping(const uint8_t* begin, size_t size, const std::string& path) {
  std::lock_guard<std::mutex> lock(mappingsLock);
  static const bool installed = [] {
    struct sigaction a{};
    a.sa_sigaction = onBusError;
    a.sa_flags = SA_SIGINFO;
    sigemptyset(&a.sa_mask);
    return sigaction(SIGBUS, &a, &previousBusAction) == 0;
  }();
  (void)installed;
  for (Mapping& m : mappings) {
    if (m.begin.load(std::memory_order_relaxed)) continue;
    m.size = size;
    const size_t n = std::min(path.size(), sizeof m.path - 1);
    std::memcpy(m.path, path.data(), n);
    m.path[n] = '\0';
    m.begin.store(begin, std::memory_order_release);
    return;
  }
  // More live mappings than slots: this one's faults get the plain SIGBUS.
}

void removeMapping(const uint8_t* begin) {
  std::lock_guard<std::mutex> lock(mappingsLock);
  for (Mapping& m : mappings)
    if (m.begin.load(std::memory_order_relaxed) == begin) m.begin.store(nullptr, std::memory_order_release);
}

void unmap(const uint8_t* data, size_t size) {
  if (!data) return;
  removeMapping(data);
  munmap(const_cast<uint8_t*>(data), size);
}

}  // namespace

MappedFile& MappedFile::operator=(MappedFile&& o) noexcept {
  if (this != &o) {
    unmap(data_, size_);
    path_ = std::move(o.path_);
    data_ = std::exchange(o.data_, nullptr);
    size_ = std::exchange(o.size_, 0);
  }
  return *this;
}

MappedFile::~MappedFile() { unmap(data_, size_); }

Result<MappedFile> MappedFile::open(const std::string& path) {
  // O_NONBLOCK: a FIFO opens at once (and is refused below) instead of waiting for a writer.
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) return makeError("cannot open ", path, ": ", std::strerror(errno));
  struct stat st;
  if (fstat(fd, &st) != 0) {
    int err = errno;
    ::close(fd);
    return makeError("cannot stat ", path, ": ", std::strerror(err));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return makeError(path, " is not a regular file");
  }
  MappedFile m;
  m.path_ = path;
  m.size_ = static_cast<size_t>(st.st_size);
  if (m.size_ > 0) {
    void* p = mmap(nullptr, m.size_, PROT_READ, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
      int err = errno;
      ::close(fd);
      return makeError("cannot map ", path, ": ", std::strerror(err));
    }
    m.data_ = static_cast<const uint8_t*>(p);
    addMapping(m.data_, m.size_, path);
  }
  ::close(fd);
  return m;
}

}  // namespace tpc
