// NVRTC compilation of generated kernels to cubin for one GPU architecture, cached on disk: the key is a
// hash of (source, arch, NVRTC version), the folder $TPC_CACHE_DIR or ~/.cache/tpc/kernels. A compile error
// keeps the source in the cache folder and returns an error with its path and NVRTC's log.
#pragma once

#include <string>
#include <vector>

#include "ir/status.h"
#include "runtime/cuda/disk_cache.h"  // defaultKernelCacheDir

namespace tpc::cuda {

struct CompileStats {
  int compiled = 0, cacheHits = 0;
  double seconds = 0;
};

class NvrtcCompiler {
 public:
  // arch: compute capability as 90 for sm_90. cacheDir empty: the default folder.
  explicit NvrtcCompiler(int arch, std::string cacheDir = "");
  // The cubin for `source` (a whole translation unit). `what` names the kernel in errors. archSpecific:
  // for sm_XXa (wgmma, setmaxnreg: the cubin runs on that architecture only).
  Result<std::vector<char>> compile(const std::string& source, const std::string& what, bool archSpecific = false);
  // ptxas's report for `source` compiled as compile() does (not cached): its registers, stack frame and spill
  // bytes per entry (--ptxas-options=-v). For tests of kernels that must not spill.
  Result<std::string> ptxasReport(const std::string& source, const std::string& what, bool archSpecific = false);
  const CompileStats& stats() const { return stats_; }
  const std::string& cacheDir() const { return cacheDir_; }

 private:
  int arch_;
  std::string cacheDir_;
  CompileStats stats_;
};

}  // namespace tpc::cuda
