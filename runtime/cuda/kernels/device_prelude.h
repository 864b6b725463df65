// CUDA C shared by every generated kernel, prepended to each NVRTC translation unit: fixed-width types,
// bf16/f16 storage as raw 16-bit words with float conversions (round to nearest even, as the CPU
// backend's floatToBf16/floatToF16), Philox dropout bits identical to runtime/philox.h, warp and block
// reductions. Self-contained: no toolkit header is included, so NVRTC needs no include path.
#pragma once

#include <string>

namespace tpc::cuda {

// The prelude text. Kernels then use:
//   types      i8 u8 i32 u32 i64 u64, bf16_t / f16_t (unsigned short words)
//   loads      float tpc_ld(const float*), tpc_ld(const bf16_t*) (as bf16), tpc_ld_f16(const f16_t*)
//   stores     tpc_st(float*, float), tpc_st_bf16(bf16_t*, float), tpc_st_f16(f16_t*, float)
//   philox     tpc_uniform(seed, step, key, index), tpc_dropout_keep(seed, step, key, index, p)
//   reduce     tpc_warp_sum, tpc_warp_max, tpc_block_sum(v, smem32), tpc_block_max(v, smem32), their double
//              versions tpc_block_sum_d / tpc_block_max_d (smem: 32 doubles), and
//              tpc_column_sum(part, P, n, col, smem32x33): the fixed-order column sums of a [P, n] matrix
//              of partial sums by a 32 x blockDim.y block (the second stage of two-stage column reductions)
const std::string& devicePrelude();

// Appended after the prelude by tensor-core kernels (sm_80 and later):
//   tpc_u32x4 (16-byte vector), tpc_mma_bf16 / tpc_mma_f16(float c[4], const u32 a[4], const u32 b[2])
//   (mma.sync m16n8k16, f32 accumulate), tpc_pack_bf16 / tpc_pack_f16(lo, hi) -> u32,
//   tpc_ldsm_x4_trans(u32 r[4], const void* shared_row) (ldmatrix .x4 .trans), tpc_cp_async16 (16 bytes global ->
//   shared) with tpc_cp_async_commit / tpc_cp_async_wait_all / tpc_cp_async_wait_one (all but the last group) /
//   tpc_cp_async_wait_n<N> (all but the last N groups),
//   tpc_ex2(x) (2^x, one MUFU.EX2, flushing results below 2^-126).
const std::string& tensorCorePrelude();

}  // namespace tpc::cuda
