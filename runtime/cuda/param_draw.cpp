#include "runtime/cuda/param_draw.h"

#include <algorithm>

#include "runtime/param_init.h"

namespace tpc::cuda {

KernelSpec normalDrawKernel(int64_t n, uint64_t key, float scale, uint32_t maxBlocks) {
  KernelSpec k;
  k.entry = "tpc_param_normal_draw";
  k.source = std::string(R"(#define TPC_HD __device__ __forceinline__
__device__ __forceinline__ unsigned int tpc_float_bits(float x) { return __float_as_uint(x); }
__device__ __forceinline__ float tpc_bits_float(unsigned int b) { return __uint_as_float(b); }
)") + normalDrawSource() + R"(
extern "C" __global__ void __launch_bounds__(256) tpc_param_normal_draw(float* out, long long n, long long key,
                                                                         float scale) {
  const long long stride = (long long)gridDim.x * blockDim.x;
  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
    out[i] = scale * tpc_normal_draw(tpc_splitmix64((unsigned long long)key + (unsigned long long)i));
}
)";
  k.block.x = 256;
  k.grid.x = static_cast<uint32_t>(std::clamp<int64_t>((n + 255) / 256, 1, maxBlocks));
  k.args = {{ArgKind::Result, 0}, {ArgKind::Int64, 0, n}, {ArgKind::Int64, 0, static_cast<int64_t>(key)},
            {ArgKind::Float, 0, 0, scale}};
  return k;
}

}  // namespace tpc::cuda
