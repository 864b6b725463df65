// NvrtcCompiler: cache lookup, NVRTC compile, atomic cache write (temp file + rename).
#include "runtime/cuda/nvrtc_compiler.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <set>
#include <thread>

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

// The cubin of `source` from NVRTC, written to the cache as base.cubin; a failure keeps the source as
// base.failed.cu and names it. Safe on several threads at once (distinct programs).
Result<std::vector<char>> compileToCache(const Nvrtc* lib, const std::string& source, const std::string& what,
                                         const std::string& arch, const std::string& base) {
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
  std::vector<char> cubin(n);
  lib->getCUBIN(prog, cubin.data());
  lib->destroyProgram(&prog);
  writeCacheFileAtomically(base + ".cubin", cubin.data(), cubin.size());  // a failed cache write only costs a recompile
  return cubin;
}

}  // namespace

Result<int> compileThreadsFromEnv() {
  const char* e = std::getenv("TPC_COMPILE_THREADS");
  if (!e || !*e) return static_cast<int>(std::clamp(std::thread::hardware_concurrency(), 1u, 16u));
  char* end = nullptr;
  const long v = std::strtol(e, &end, 10);
  if (end == e || *end || v < 1 || v > 64)
    return makeError("TPC_COMPILE_THREADS=", e, ": expected how many kernels NVRTC compiles at once, 1-64 ",
                     "(unset: the machine's cores, at most 16)");
  return static_cast<int>(v);
}

NvrtcCompiler::NvrtcCompiler(int arch, std::string cacheDir)
    : arch_(arch), cacheDir_(cacheDir.empty() ? defaultKernelCacheDir() : std::move(cacheDir)) {}

std::pair<std::string, std::string> NvrtcCompiler::cachePath(const std::string& source, bool archSpecific) const {
  int major = 0, minor = 0;
  if (auto lib = nvrtc(); lib.ok()) (*lib)->version(&major, &minor);
  char key[64];
  std::string arch = cat(arch_, archSpecific ? "a" : "");
  std::snprintf(key, sizeof key, "%016llx", static_cast<unsigned long long>(
                                                fnv1a(source, fnv1a(cat("sm_", arch, " nvrtc ", major, ".", minor, "\n")))));
  return {cat(cacheDir_, "/", key, "_sm", arch), arch};
}

Result<std::vector<char>> NvrtcCompiler::compile(const std::string& source, const std::string& what, bool archSpecific) {
  TPC_ASSIGN(const Nvrtc* lib, nvrtc());
  auto t0 = std::chrono::steady_clock::now();
  auto [base, arch] = cachePath(source, archSpecific);
  if (auto it = compiled_.find(base); it != compiled_.end()) return it->second;  // counted by compileAll
  std::vector<char> cubin;
  if (readCacheFile(base + ".cubin", cubin)) {
    ++stats_.cacheHits;
    return cubin;
  }
  TPC_TRY(makeDirs(cacheDir_));
  TPC_ASSIGN(cubin, compileToCache(lib, source, what, arch, base));
  ++stats_.compiled;
  stats_.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return cubin;
}

Status NvrtcCompiler::compileAll(const std::vector<KernelSource>& kernels, int threads) {
  TPC_ASSIGN(const Nvrtc* lib, nvrtc());
  auto t0 = std::chrono::steady_clock::now();
  struct Job {
    const KernelSource* k;
    std::string base, arch;
    std::optional<Result<std::vector<char>>> cubin;
  };
  std::vector<Job> jobs;
  std::set<std::string> seen;
  for (const KernelSource& k : kernels) {
    auto [base, arch] = cachePath(*k.source, k.archSpecific);
    if (compiled_.contains(base) || !seen.insert(base).second) continue;
    std::error_code ec;  // cached: compile() reads it (readCacheFile: a non-empty file)
    if (std::filesystem::file_size(base + ".cubin", ec) > 0 && !ec) continue;
    jobs.push_back({&k, std::move(base), std::move(arch), std::nullopt});
  }
  if (jobs.empty()) return {};
  TPC_TRY(makeDirs(cacheDir_));
  std::atomic<size_t> next{0};
  auto work = [&] {
    for (size_t i; (i = next.fetch_add(1)) < jobs.size();)
      jobs[i].cubin = compileToCache(lib, *jobs[i].k->source, jobs[i].k->what, jobs[i].arch, jobs[i].base);
  };
  std::vector<std::thread> pool;
  const size_t n = std::min<size_t>(jobs.size(), static_cast<size_t>(std::max(threads, 1)));
  for (size_t t = 1; t < n; ++t) pool.emplace_back(work);
  work();
  for (auto& t : pool) t.join();
  stats_.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  for (Job& j : jobs) {
    if (!j.cubin->ok()) return Error{j.cubin->error()};
    compiled_[j.base] = std::move(*j.cubin).value();
    ++stats_.compiled;
  }
  return {};
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
