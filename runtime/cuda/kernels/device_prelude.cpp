#include "runtime/cuda/kernels/device_prelude.h"

namespace tpc::cuda {

const std::string& devicePrelude() {
  static const std::string text = R"CUDA(
typedef signed char i8;
typedef unsigned char u8;
typedef int i32;
typedef unsigned int u32;
typedef long long i64;
typedef unsigned long long u64;
typedef unsigned short bf16_t;
typedef unsigned short f16_t;
#define TPC_INF __int_as_float(0x7f800000)

__device__ __forceinline__ float tpc_bf16_to_f32(bf16_t h) { return __uint_as_float(((u32)h) << 16); }
__device__ __forceinline__ bf16_t tpc_f32_to_bf16(float f) {
  u32 u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (bf16_t)((u >> 16) | 0x40u);  // NaN stays NaN
  u += 0x7fffu + ((u >> 16) & 1u);                                           // round to nearest even
  return (bf16_t)(u >> 16);
}
__device__ __forceinline__ float tpc_f16_to_f32(f16_t h) {
  float f;
  asm("{ cvt.f32.f16 %0, %1; }" : "=f"(f) : "h"(h));
  return f;
}
__device__ __forceinline__ f16_t tpc_f32_to_f16(float f) {
  f16_t h;
  asm("{ cvt.rn.f16.f32 %0, %1; }" : "=h"(h) : "f"(f));
  return h;
}
__device__ __forceinline__ float tpc_ld(const float* p) { return *p; }
__device__ __forceinline__ float tpc_ld(const bf16_t* p) { return tpc_bf16_to_f32(*p); }
__device__ __forceinline__ float tpc_ld_f16(const f16_t* p) { return tpc_f16_to_f32(*p); }
__device__ __forceinline__ void tpc_st(float* p, float v) { *p = v; }
__device__ __forceinline__ void tpc_st_bf16(bf16_t* p, float v) { *p = tpc_f32_to_bf16(v); }
__device__ __forceinline__ void tpc_st_f16(f16_t* p, float v) { *p = tpc_f32_to_f16(v); }

// Philox4x32-10, exactly runtime/philox.h: counter = (index / 4, step, key), key = seed, lane index % 4.
__device__ __forceinline__ float tpc_uniform(u64 seed, i64 step, u32 key, u64 index) {
  u64 block = index >> 2;
  u32 c0 = (u32)block, c1 = (u32)(block >> 32), c2 = (u32)step, c3 = key;
  u32 k0 = (u32)seed, k1 = (u32)(seed >> 32);
#pragma unroll
  for (int r = 0; r < 10; ++r) {
    u32 lo0 = 0xD2511F53u * c0, hi0 = __umulhi(0xD2511F53u, c0);
    u32 lo1 = 0xCD9E8D57u * c2, hi1 = __umulhi(0xCD9E8D57u, c2);
    u32 n0 = hi1 ^ c1 ^ k0, n1 = lo1, n2 = hi0 ^ c3 ^ k1, n3 = lo0;
    c0 = n0; c1 = n1; c2 = n2; c3 = n3;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  u32 lane = (u32)(index & 3);
  u32 bits = lane == 0 ? c0 : lane == 1 ? c1 : lane == 2 ? c2 : c3;
  return (float)(bits >> 8) * (1.0f / 16777216.0f);
}
__device__ __forceinline__ bool tpc_dropout_keep(u64 seed, i64 step, u32 key, u64 index, float p) {
  return tpc_uniform(seed, step, key, index) >= p;
}

__device__ __forceinline__ float tpc_warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float tpc_warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
// Block-wide reductions; `smem` holds 32 floats; every thread gets the result. Fixed order: deterministic.
__device__ __forceinline__ float tpc_block_sum(float v, float* smem) {
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = (blockDim.x + 31) >> 5;
  v = tpc_warp_sum(v);
  __syncthreads();
  if (lane == 0) smem[warp] = v;
  __syncthreads();
  v = lane < nwarps ? smem[lane] : 0.f;
  return tpc_warp_sum(v);
}
__device__ __forceinline__ float tpc_block_max(float v, float* smem) {
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = (blockDim.x + 31) >> 5;
  v = tpc_warp_max(v);
  __syncthreads();
  if (lane == 0) smem[warp] = v;
  __syncthreads();
  v = lane < nwarps ? smem[lane] : -TPC_INF;
  return tpc_warp_max(v);
}
// The same in double; `smem` holds 32 doubles.
__device__ __forceinline__ double tpc_block_sum_d(double v, double* smem) {
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = (blockDim.x + 31) >> 5;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  __syncthreads();
  if (lane == 0) smem[warp] = v;
  __syncthreads();
  v = lane < nwarps ? smem[lane] : 0.0;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ double tpc_block_max_d(double v, double* smem) {
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = (blockDim.x + 31) >> 5;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmax(v, __shfl_xor_sync(0xffffffffu, v, o));
  __syncthreads();
  if (lane == 0) smem[warp] = v;
  __syncthreads();
  v = lane < nwarps ? smem[lane] : -(double)TPC_INF;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmax(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
// Column sums of a [P, n] matrix of partial sums (T float or double), in a fixed order: a block of
// 32 x blockDim.y threads (blockDim.y <= 32) owns columns col0 + threadIdx.x; row lane
// threadIdx.y sums rows y, y + blockDim.y, ... (16 loaded at a time, then added in that order); the lanes are
// then added in order. `smem` holds 32 x 33 doubles. Thread (x, 0) returns the sum of its column (others
// return garbage). Every thread must call it.
template <class T>
__device__ __forceinline__ double tpc_column_sum(const T* part, i64 P, i64 n, i64 col, double* smem) {
  double acc = 0;
  if (col < n)
    for (i64 p0 = threadIdx.y; p0 < P; p0 += 16 * (i64)blockDim.y) {
      double v[16];
#pragma unroll
      for (int j = 0; j < 16; ++j) {
        const i64 p = p0 + j * (i64)blockDim.y;
        v[j] = p < P ? (double)part[p * n + col] : 0.0;
      }
#pragma unroll
      for (int j = 0; j < 16; ++j)  // rows past P skipped, not added as 0 (a -0 sum would become +0)
        if (p0 + j * (i64)blockDim.y < P) acc += v[j];
    }
  smem[threadIdx.y * 33 + threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y == 0)
    for (unsigned l = 1; l < blockDim.y; ++l) acc += smem[l * 33 + threadIdx.x];
  __syncthreads();
  return acc;
}
)CUDA";
  return text;
}

const std::string& tensorCorePrelude() {
  static const std::string text = R"CUDA(
// Tensor-core building blocks (sm_80+; tests/unit/cuda_emulator.h swaps this whole block for a host version).
struct alignas(16) tpc_u32x4 { u32 x, y, z, w; };
// c += a b on one m16n8k16 tile, f32 accumulators, a row-major 16x16 and b column-major 16x8 16-bit floats.
__device__ __forceinline__ void tpc_mma_bf16(float* c, const u32* a, const u32* b) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
               : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
__device__ __forceinline__ void tpc_mma_f16(float* c, const u32* a, const u32* b) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
               : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
// Two floats as one word of 16-bit floats (lo in the low half), rounded to nearest even.
__device__ __forceinline__ u32 tpc_pack_bf16(float lo, float hi) {
  u32 r;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}
__device__ __forceinline__ u32 tpc_pack_f16(float lo, float hi) {
  u32 r;
  asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}
// Four transposed 8x8 tiles of 16-bit values from shared memory: lane l names row l % 8 of tile l / 8.
__device__ __forceinline__ void tpc_ldsm_x4_trans(u32* r, const void* row) {
  u32 addr;
  asm("{ .reg .u64 a; cvta.to.shared.u64 a, %1; cvt.u32.u64 %0, a; }" : "=r"(addr) : "l"(row));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
// Four 8x8 tiles of 16-bit values from shared memory, not transposed: lane l names row l % 8 of tile l / 8;
// lane (g = l / 4, t = l % 4) gets row g, columns 2t, 2t + 1 of each tile.
__device__ __forceinline__ void tpc_ldsm_x4(u32* r, const void* row) {
  u32 addr;
  asm("{ .reg .u64 a; cvta.to.shared.u64 a, %1; cvt.u32.u64 %0, a; }" : "=r"(addr) : "l"(row));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
// 16 bytes global -> shared without passing through registers (cp.async, L2 only); with full false the
// 16 bytes are zeros and src is not read. Completes at tpc_cp_async_wait_all() of a later committed group.
__device__ __forceinline__ void tpc_cp_async16(void* dst, const void* src, bool full) {
  u32 addr;
  asm("{ .reg .u64 a; cvta.to.shared.u64 a, %1; cvt.u32.u64 %0, a; }" : "=r"(addr) : "l"(dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(addr), "l"(src), "r"(full ? 16 : 0) : "memory");
}
__device__ __forceinline__ void tpc_cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
__device__ __forceinline__ void tpc_cp_async_wait_all() { asm volatile("cp.async.wait_group 0;" ::: "memory"); }
// All but the most recently committed group complete (a two-buffer pipeline's wait).
__device__ __forceinline__ void tpc_cp_async_wait_one() { asm volatile("cp.async.wait_group 1;" ::: "memory"); }
// All but the N most recently committed groups complete (an N + 1 deep pipeline's wait).
template <int N> __device__ __forceinline__ void tpc_cp_async_wait_n() { asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory"); }
// 2^x in one MUFU.EX2, results below 2^-126 flushed to zero (exp2f without fast math adds a denormal fix-up).
__device__ __forceinline__ float tpc_ex2(float x) {
  float r;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
  return r;
}
)CUDA";
  return text;
}

}  // namespace tpc::cuda
