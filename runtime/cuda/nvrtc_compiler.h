// NVRTC compilation of generated kernels to cubin for one GPU architecture, cached on disk: the key is a
// hash of (source, arch, NVRTC version), the folder $TPC_CACHE_DIR or ~/.cache/tpc/kernels. A compile error
// keeps the source in the cache folder and returns an error with its path and NVRTC's log. compileAll compiles
// a model's kernels on several threads at once (NVRTC is thread-safe across programs).
#pragma once

#include <map>
#include <string>
#include <vector>

#include "ir/status.h"
#include "runtime/cuda/disk_cache.h"  // defaultKernelCacheDir

namespace tpc::cuda {

struct CompileStats {
  int compiled = 0, cacheHits = 0;
  double seconds = 0;  // wall time spent compiling (compileAll's threads count once)
};

// A kernel for compileAll: its whole translation unit (not copied: it must outlive the call), its name in
// errors, and whether it is for sm_XXa.
struct KernelSource {
  const std::string* source = nullptr;
  std::string what;
  bool archSpecific = false;
};

// compileAll's threads: TPC_COMPILE_THREADS (1-64; 1 compiles one kernel at a time) or else the machine's cores,
// at most 16. An error names a bad value.
Result<int> compileThreadsFromEnv();

class NvrtcCompiler {
 public:
  // arch: compute capability as 90 for sm_90. cacheDir empty: the default folder.
  explicit NvrtcCompiler(int arch, std::string cacheDir = "");
  // The cubin for `source` (a whole translation unit). `what` names the kernel in errors. archSpecific:
  // for sm_XXa (wgmma, setmaxnreg: the cubin runs on that architecture only).
  Result<std::vector<char>> compile(const std::string& source, const std::string& what, bool archSpecific = false);
  // Every kernel of `kernels` that is not in the cache folder, compiled on up to `threads` threads at once and
  // written to the cache; compile() then returns their cubins without compiling. A model's kernels then take
  // about the slowest one's time instead of the sum: a fresh H200 host compiled gpt2's 35, our GEMM kernels
  // among them at several seconds each, in 20 s one at a time. Sources named twice compile once. The first
  // failure in `kernels`' order is the error, as compile() gives it.
  Status compileAll(const std::vector<KernelSource>& kernels, int threads);
  // ptxas's report for `source` compiled as compile() does (not cached): its registers, stack frame and spill
  // bytes per entry (--ptxas-options=-v). For tests of kernels that must not spill.
  Result<std::string> ptxasReport(const std::string& source, const std::string& what, bool archSpecific = false);
  const CompileStats& stats() const { return stats_; }
  const std::string& cacheDir() const { return cacheDir_; }

 private:
  // The cache file's path without its extension, and the arch string ("90" or "90a").
  std::pair<std::string, std::string> cachePath(const std::string& source, bool archSpecific) const;
  int arch_;
  std::string cacheDir_;
  CompileStats stats_;
  std::map<std::string, std::vector<char>> compiled_;  // compileAll's cubins by cache path
};

}  // namespace tpc::cuda
