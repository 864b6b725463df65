// Data folder lookup: environment, then next to the executable, then the source tree.
#include "frontend/data_dir.h"

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <system_error>

#include "tpc/version.h"

namespace tpc {
namespace fs = std::filesystem;

namespace {

std::string executableDir() {
  std::error_code ec;
  fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  return ec ? std::string() : exe.parent_path().string();
}

bool isDir(const fs::path& p) {
  std::error_code ec;
  return fs::is_directory(p, ec);
}

}  // namespace

std::string dataDir() {
  if (const char* env = std::getenv("TPC_DATA_DIR"); env && *env) return env;
  std::string exeDir = executableDir();
  if (!exeDir.empty()) {
    for (const char* rel : {"../../data", "../data"}) {
      fs::path candidate = fs::path(exeDir) / rel;
      if (isDir(candidate)) return candidate.lexically_normal().string();
    }
  }
  return TPC_SOURCE_DIR "/data";
}

Result<std::string> requireDataFile(const std::string& relPath, const std::string& what) {
  std::string path = (fs::path(dataDir()) / relPath).string();
  std::error_code ec;
  if (fs::is_directory(path, ec))
    return makeError(what, " file ", path, " is a folder; remove it and run scripts/fetch_data.sh to download the file",
                     " (or set TPC_DATA_DIR to the folder that holds ", relPath, ")");
  if (!fs::is_regular_file(path, ec))
    return makeError(what, " file ", path, " not found; run scripts/fetch_data.sh to download it",
                     " (or set TPC_DATA_DIR to the folder that holds ", relPath, ")");
  return path;
}

}  // namespace tpc
