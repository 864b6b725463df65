// Atomic file output.
#include "ir/file_io.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>

namespace tpc {

Status writeFileAtomically(const std::string& path, std::string_view contents) {
  std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    if (!f) return makeError(path, ": error: cannot write: ", std::strerror(errno));
    f.write(contents.data(), static_cast<std::streamsize>(contents.size()));
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
