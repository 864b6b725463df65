// NvrtcCompiler: cache lookup, NVRTC compile, atomic cache write (temp file + rename).
#include "runtime/cuda/nvrtc_compiler.h"

#include <chrono>
#include <cstdio>
#include <cstdlib>

#include "runtime/cuda/cuda_libraries.h"
#include "runtime/cuda/disk_cache.h"

namespace tpc::cuda {
namespace {

Result<nvrtcProgram> createProgram(const Nvrtc* lib, const std::string& source, const std::string& what) {
  nvrtcProgram prog;
  if (nvrtcResult r = lib->createProgram(&prog, source.c_str(), (what + ".cu").c_str(), 0, nullptr, nullptr);
      r != NVRTC_SUCCESS)
    return makeError("nvrtc: cannot create a program for ", what, ": ", lib->getErrorString(r));
  return prog;
}

// NVRTC's options for every kernel (fmad off: the CPU backend's rounding), and extra ones.
Status compileProgram(const Nvrtc* lib, nvrtcProgram prog, const std::string& arch, std::vector<const char*> extra = {}) {
  std::string archOpt = cat("--gpu-architecture=sm_", arch);
  std::vector<const char*> opts = {archOpt.c_str(), "--std=c++17", "-default-device", "--fmad=false"};
  opts.insert(opts.end(), extra.begin(), extra.end());
  nvrtcResult r = lib->compileProgram(prog, static_cast<int>(opts.size()), opts.data());
  if (r == NVRTC_SUCCESS) return {};
  return makeError(lib->getErrorString(r));
}

std::string programLog(const Nvrtc* lib, nvrtcProgram prog) {
  size_t logSize = 0;
  lib->getProgramLogSize(prog, &logSize);
  std::string log(logSize, '\0');
  lib->getProgramLog(prog, log.data());
  while (!log.empty() && log.back() == '\0') log.pop_back();
  return log;
}

}  // namespace

NvrtcCompiler::NvrtcCompiler(int arch, std::string cacheDir)
    : arch_(arch), cacheDir_(cacheDir.empty() ? defaultKernelCacheDir() : std::move(cacheDir)) {}

Result<std::vector<char>> NvrtcCompiler::compile(const std::string& source, const std::string& what, bool archSpecific) {
  TPC_ASSIGN(const Nvrtc* lib, nvrtc());
  auto t0 = std::chrono::steady_clock::now();
  int major = 0, minor = 0;
  lib->version(&major, &minor);
  char key[64];
  std::string arch = cat(arch_, archSpecific ? "a" : "");
  std::snprintf(key, sizeof key, "%016llx", static_cast<unsigned long long>(
                                                fnv1a(source, fnv1a(cat("sm_", arch, " nvrtc ", major, ".", minor, "\n")))));
  std::string base = cat(cacheDir_, "/", key, "_sm", arch);
  std::vector<char> cubin;
  if (readCacheFile(base + ".cubin", cubin)) {
    ++stats_.cacheHits;
    return cubin;
  }
  TPC_TRY(makeDirs(cacheDir_));

  TPC_ASSIGN(nvrtcProgram prog, createProgram(lib, source, what));
  if (Status st = compileProgram(lib, prog, arch); !st.ok()) {
    std::string log = programLog(lib, prog);
    lib->destroyProgram(&prog);
    std::string srcPath = base + ".failed.cu";
    writeCacheFileAtomically(srcPath, source.data(), source.size());
    return makeError("nvrtc: compiling kernel ", what, " for sm_", arch, " failed (", st.error(),
                     "); the generated source is kept at ", srcPath, "\n", log);
  }
  size_t n = 0;
  lib->getCUBINSize(prog, &n);
  cubin.resize(n);
  lib->getCUBIN(prog, cubin.data());
  lib->destroyProgram(&prog);
  writeCacheFileAtomically(base + ".cubin", cubin.data(), cubin.size());  // a failed cache write only costs a recompile
  ++stats_.compiled;
  stats_.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return cubin;
}

Result<std::string> NvrtcCompiler::ptxasReport(const std::string& source, const std::string& what, bool archSpecific) {
  TPC_ASSIGN(const Nvrtc* lib, nvrtc());
  TPC_ASSIGN(nvrtcProgram prog, createProgram(lib, source, what));
  Status st = compileProgram(lib, prog, cat(arch_, archSpecific ? "a" : ""), {"--ptxas-options=-v"});
  std::string log = programLog(lib, prog);
  lib->destroyProgram(&prog);
  if (!st.ok()) return makeError("nvrtc: compiling kernel ", what, " failed (", st.error(), ")\n", log);
  return log;
}

}  // namespace tpc::cuda
