// A read-only memory mapping of a whole file (RAII, move-only). A file that shrinks while it is mapped (a dataset
// rewritten under a run) makes reads past its new end fault with SIGBUS; the process then ends with one error that
// names the file, exit code 1, instead of a crash.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "ir/status.h"

namespace tpc {

class MappedFile {
 public:
  MappedFile() = default;
  MappedFile(MappedFile&& o) noexcept { *this = std::move(o); }
  MappedFile& operator=(MappedFile&& o) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  ~MappedFile();

  // Maps path read-only; an empty file maps to size() == 0 and data() == nullptr.
  static Result<MappedFile> open(const std::string& path);

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace tpc
