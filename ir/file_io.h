// File output shared by every tool and writer: nothing half-written is ever left behind (a temporary name, then rename).
#pragma once

#include <filesystem>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "ir/status.h"

namespace tpc {

Status writeFileAtomically(const std::string& path, std::string_view contents);
// The same for a file written from pieces, in order, without joining them first (a checkpoint's tensors: one copy
// of them in memory, not two).
Status writeFileAtomically(const std::string& path, const std::vector<std::string_view>& pieces);

// Removes the file `path` if SIGINT, SIGTERM or SIGHUP ends the process while this object lives: destructors do not
// run then, so Ctrl-C during a long write would leave its temporary file behind. The process still dies of the
// signal (a shell sees 130 for Ctrl-C). A signal that is ignored (nohup) or has a handler of someone else's is
// left alone. At most 16 paths are guarded at once, and no path longer than PATH_MAX.
class RemoveOnSignal {
 public:
  RemoveOnSignal() = default;
  explicit RemoveOnSignal(const std::string& path);
  RemoveOnSignal(RemoveOnSignal&& o) noexcept : slot_(std::exchange(o.slot_, -1)) {}
  RemoveOnSignal& operator=(RemoveOnSignal&& o) noexcept;
  ~RemoveOnSignal() { release(); }
  // Stops guarding (the file was renamed into place, or removed).
  void release();

 private:
  int slot_ = -1;
};

// The outermost folder of `path` (itself included) that does not exist yet: what create_directories(path) would
// make, for removing it again. Empty when `path` exists.
std::filesystem::path firstMissingFolder(const std::filesystem::path& path);

// Removes `path` (a folder and all in it) when destroyed, unless keep() was called: a write that fails midway
// leaves nothing behind.
class RemoveOnError {
 public:
  explicit RemoveOnError(std::filesystem::path path) : path_(std::move(path)) {}
  RemoveOnError(const RemoveOnError&) = delete;
  RemoveOnError& operator=(const RemoveOnError&) = delete;
  ~RemoveOnError() {
    std::error_code ec;
    if (!kept_ && !path_.empty()) std::filesystem::remove_all(path_, ec);
  }
  void keep() { kept_ = true; }

 private:
  std::filesystem::path path_;
  bool kept_ = false;
};

}  // namespace tpc
