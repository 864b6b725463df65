// The on-disk cache folder shared by NVRTC's cubins and the timed cuBLASLt algorithms: $TPC_CACHE_DIR or
// ~/.cache/tpc/kernels. Entries are written atomically (temp file + rename), so concurrent runs are safe; a
// failed write only costs the work again next time.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ir/status.h"

namespace tpc::cuda {

std::string defaultKernelCacheDir();
uint64_t fnv1a(const std::string& s, uint64_t h = 1469598103934665603ull);
Status makeDirs(const std::string& path);
// False when the file is missing or empty.
bool readCacheFile(const std::string& path, std::vector<char>& out);
bool writeCacheFileAtomically(const std::string& path, const char* data, size_t n);

}  // namespace tpc::cuda
