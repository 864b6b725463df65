// Output files checked before a command does any work (tools/output_paths.h).
#include "tools/output_paths.h"

#include <unistd.h>

#include <algorithm>
#include <system_error>

#include "ir/file_io.h"

namespace tpc::cli {

namespace fs = std::filesystem;

// Whether two paths name one file: the same file where both exist, else the same absolute normal path (an output
// not written yet can still be another output, or an input that does not exist yet).
bool sameFile(const fs::path& a, const fs::path& b) {
  std::error_code ea, eb;
  if (fs::exists(a, ea) && fs::exists(b, eb)) return fs::equivalent(a, b, ea) && !ea;
  const fs::path x = fs::weakly_canonical(fs::absolute(a), ea), y = fs::weakly_canonical(fs::absolute(b), eb);
  return !ea && !eb && x == y;
}

// Whether `file` is inside the folder `dir` (at any depth).
fs::path pathInFolder(const fs::path& file, const fs::path& dir) {
  std::error_code ef, ed;
  const fs::path f = fs::weakly_canonical(fs::absolute(file), ef);
  fs::path d = fs::weakly_canonical(fs::absolute(dir), ed);
  if (ef || ed || d.empty()) return {};
  if (d.filename().empty()) d = d.parent_path();  // "ck/" ends in an empty element
  if (std::mismatch(d.begin(), d.end(), f.begin(), f.end()).first != d.end() || f == d) return {};
  return f.lexically_relative(d);
}

bool insideFolder(const fs::path& file, const fs::path& dir) { return !pathInFolder(file, dir).empty(); }

Status checkOutputFile(const std::string& flag, const std::string& path) {
  if (path.empty()) return makeError(flag, " is empty; name the file to write");
  std::error_code ec;
  if (fs::is_directory(path, ec))
    return makeError(flag, " ", path, ": error: is a directory; name a file to write, not a folder");
  // A link is written through (its target replaced); a device or FIFO is written into, so only it must be writable.
  const std::string target = outputTarget(path);
  if (writtenInPlace(target)) {
    if (access(target.c_str(), W_OK) != 0) return makeError(flag, " ", path, ": error: is not writable; pick another");
    return {};
  }
  const fs::path parent = fs::path(target).parent_path(), folder = parent.empty() ? fs::path(".") : parent;
  if (!fs::is_directory(folder, ec))
    return makeError(flag, " ", path, ": error: the folder ", folder.string(),
                     fs::exists(folder, ec) ? " is a file, not a folder; pick a file in a folder"
                                            : " does not exist; create it first");
  if (access(folder.c_str(), W_OK) != 0)
    return makeError(flag, " ", path, ": error: the folder ", folder.string(), " is not writable; pick another");
  return {};
}

}  // namespace tpc::cli
