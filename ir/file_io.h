// File output shared by every tool and writer: nothing half-written is ever left behind (a temporary name, then rename).
#pragma once

#include <filesystem>
#include <string>
#include <string_view>

#include "ir/status.h"

namespace tpc {

Status writeFileAtomically(const std::string& path, std::string_view contents);

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
