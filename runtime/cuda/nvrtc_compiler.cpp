// NvrtcCompiler: cache lookup, NVRTC compile, atomic cache write (temp file + rename).
#include "runtime/cuda/nvrtc_compiler.h"

#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "runtime/cuda/cuda_libraries.h"

namespace tpc::cuda {
namespace {

uint64_t fnv1a(const std::string& s, uint64_t h = 1469598103934665603ull) {
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

bool readFile(const std::string& path, std::vector<char>& out) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return false;
  out.assign(std::istreambuf_iterator<char>(f), {});
  return !out.empty();
}

bool writeAtomically(const std::string& path, const char* data, size_t n) {
  std::string tmp = path + ".tmp" + std::to_string(getpid());
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    if (!f) return false;
    f.write(data, static_cast<std::streamsize>(n));
    if (!f) return false;
  }
  return std::rename(tmp.c_str(), path.c_str()) == 0;
}

}  // namespace

std::string defaultKernelCacheDir() {
  if (const char* d = std::getenv("TPC_CACHE_DIR"); d && *d) return d;
  if (const char* h = std::getenv("HOME"); h && *h) return std::string(h) + "/.cache/tpc/kernels";
  return "/tmp/tpc-kernels";
}

NvrtcCompiler::NvrtcCompiler(int arch, std::string cacheDir)
    : arch_(arch), cacheDir_(cacheDir.empty() ? defaultKernelCacheDir() : std::move(cacheDir)) {}

Result<std::vector<char>> NvrtcCompiler::compile(const std::string& source, const std::string& what) {
  TPC_ASSIGN(const Nvrtc* lib, nvrtc());
  auto t0 = std::chrono::steady_clock::now();
  int major = 0, minor = 0;
  lib->version(&major, &minor);
  char key[64];
  std::snprintf(key, sizeof key, "%016llx", static_cast<unsigned long long>(
                                                fnv1a(source, fnv1a(cat("sm_", arch_, " nvrtc ", major, ".", minor, "\n")))));
  std::string base = cat(cacheDir_, "/", key, "_sm", arch_);
  std::vector<char> cubin;
  if (readFile(base + ".cubin", cubin)) {
    ++stats_.cacheHits;
    return cubin;
  }
  TPC_TRY(makeDirs(cacheDir_));

  nvrtcProgram prog;
  if (nvrtcResult r = lib->createProgram(&prog, source.c_str(), (what + ".cu").c_str(), 0, nullptr, nullptr);
      r != NVRTC_SUCCESS)
    return makeError("nvrtc: cannot create a program for ", what, ": ", lib->getErrorString(r));
  std::string archOpt = cat("--gpu-architecture=sm_", arch_);
  const char* opts[] = {archOpt.c_str(), "--std=c++17", "-default-device", "--fmad=false"};
  nvrtcResult r = lib->compileProgram(prog, 4, opts);
  if (r != NVRTC_SUCCESS) {
    size_t logSize = 0;
    lib->getProgramLogSize(prog, &logSize);
    std::string log(logSize, '\0');
    lib->getProgramLog(prog, log.data());
    lib->destroyProgram(&prog);
    std::string srcPath = base + ".failed.cu";
    writeAtomically(srcPath, source.data(), source.size());
    return makeError("nvrtc: compiling kernel ", what, " for sm_", arch_, " failed (", lib->getErrorString(r),
                     "); the generated source is kept at ", srcPath, "\n", log);
  }
  size_t n = 0;
  lib->getCUBINSize(prog, &n);
  cubin.resize(n);
  lib->getCUBIN(prog, cubin.data());
  lib->destroyProgram(&prog);
  writeAtomically(base + ".cubin", cubin.data(), cubin.size());  // a failed cache write only costs a recompile
  ++stats_.compiled;
  stats_.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return cubin;
}

}  // namespace tpc::cuda
