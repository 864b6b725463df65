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

// A library's choice timed on this machine (a cuBLASLt algorithm, a cuDNN engine config), remembered by this
// process and in the cache folder as the full key, a newline and the choice's bytes, in a file named by the
// key's hash and `ext`. The key should name the GPU (currentGpuKey) and the library's version: a choice timed
// elsewhere is not reused. read: false when nothing is remembered under the key (or the file is torn or
// collides). remember: the choice now remembered under the key, the first one given (threads that timed the
// same problem at once agree), written to the folder when it is new.
std::string currentGpuKey();  // "NVIDIA H200 sm90 x132": the current device's name, compute capability and SMs
bool readRememberedChoice(const std::string& fullKey, const char* ext, std::string* bytes);
std::string rememberChoice(const std::string& fullKey, const char* ext, const std::string& bytes);

}  // namespace tpc::cuda
