// The cache folder's helpers (disk_cache.h).
#include "runtime/cuda/disk_cache.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <iterator>
#include <map>
#include <mutex>
#include <sstream>
#include <thread>

#include <cuda_runtime_api.h>

namespace tpc::cuda {

uint64_t fnv1a(const std::string& s, uint64_t h) {
  for (unsigned char c : s) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

Status makeDirs(const std::string& path) {
  std::string cur;
  std::stringstream ss(path);
  std::string part;
  if (!path.empty() && path[0] == '/') cur = "/";
  while (std::getline(ss, part, '/')) {
    if (part.empty()) continue;
    cur += part + "/";
    if (mkdir(cur.c_str(), 0755) != 0 && errno != EEXIST)
      return makeError("cannot create the kernel cache folder ", cur, " (set TPC_CACHE_DIR to a writable folder)");
  }
  return {};
}

bool readCacheFile(const std::string& path, std::vector<char>& out) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return false;
  out.assign(std::istreambuf_iterator<char>(f), {});
  return !out.empty();
}

bool writeCacheFileAtomically(const std::string& path, const char* data, size_t n) {
  // Unique to this process and thread (NvrtcCompiler::compileAll writes from several threads).
  std::string tmp = cat(path, ".tmp", getpid(), "_", std::hash<std::thread::id>{}(std::this_thread::get_id()));
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    if (!f) return false;
    f.write(data, static_cast<std::streamsize>(n));
    if (!f) return false;
  }
  return std::rename(tmp.c_str(), path.c_str()) == 0;
}

std::string defaultKernelCacheDir() {
  if (const char* d = std::getenv("TPC_CACHE_DIR"); d && *d) return d;
  if (const char* h = std::getenv("HOME"); h && *h) return std::string(h) + "/.cache/tpc/kernels";
  return "/tmp/tpc-kernels";
}

std::string currentGpuKey() {
  int dev = 0;
  cudaGetDevice(&dev);
  cudaDeviceProp prop{};
  cudaGetDeviceProperties(&prop, dev);
  return cat(prop.name, " sm", prop.major, prop.minor, " x", prop.multiProcessorCount);
}

namespace {

std::mutex& memoMutex() {
  static std::mutex m;
  return m;
}
std::map<std::string, std::string>& memo() {  // by ext + full key
  static std::map<std::string, std::string> m;
  return m;
}

std::string choicePath(const std::string& fullKey, const char* ext) {
  char name[40];
  std::snprintf(name, sizeof name, "%016llx.", static_cast<unsigned long long>(fnv1a(fullKey)));
  return cat(defaultKernelCacheDir(), "/", name, ext);
}

}  // namespace

bool readRememberedChoice(const std::string& fullKey, const char* ext, std::string* bytes) {
  std::lock_guard<std::mutex> lock(memoMutex());
  const std::string memoKey = cat(ext, " ", fullKey);
  if (auto it = memo().find(memoKey); it != memo().end()) {
    *bytes = it->second;
    return true;
  }
  std::vector<char> file;
  if (!readCacheFile(choicePath(fullKey, ext), file)) return false;
  if (file.size() <= fullKey.size() || file[fullKey.size()] != '\n' ||
      std::memcmp(file.data(), fullKey.data(), fullKey.size()) != 0)
    return false;  // a hash collision or a torn file: time again
  bytes->assign(file.begin() + static_cast<std::ptrdiff_t>(fullKey.size()) + 1, file.end());
  memo()[memoKey] = *bytes;
  return true;
}

std::string rememberChoice(const std::string& fullKey, const char* ext, const std::string& bytes) {
  std::lock_guard<std::mutex> lock(memoMutex());
  auto [it, fresh] = memo().emplace(cat(ext, " ", fullKey), bytes);
  if (fresh) {
    std::string file = fullKey + "\n" + bytes;
    if (makeDirs(defaultKernelCacheDir()).ok()) writeCacheFileAtomically(choicePath(fullKey, ext), file.data(), file.size());
  }
  return it->second;
}

}  // namespace tpc::cuda
