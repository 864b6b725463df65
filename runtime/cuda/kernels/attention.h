// Shared by the two flash-attention kernel sets (attention.cpp: f32 on CUDA cores, any dtype;
// attention_tensor_core.cpp: bf16/f16 on tensor cores): the op's shape and attributes as the kernels
// see them, the common CUDA C head (constants, Philox dropout mask, tile loads), and each set's lowering.
#pragma once

#include "runtime/cuda/kernels/family_lowerings.h"

namespace tpc::cuda {

// Where the rows of one [B, H, T, Dh] tensor are: row (b, h, t) starts at element off + b sb + h sh + t st of
// the kernel argument `arg`, its Dh elements contiguous. attention's tensors are contiguous [B, H, T, Dh];
// attention_qkv's q, k, v (and dq, dk, dv) are views of one packed tensor, its out and dout [B, T, H, Dh].
struct AttnRows {
  KernelArg arg;
  int64_t off, sb, sh, st;
};

struct AttnShape {
  int64_t B, H, Tq, Tk, D, Dp, LD;
  bool causal;
  double scale, dropout;
  int64_t key, Hg, offB, offH;
  DType dt;  // of q, k, v
  AttnRows q, k, v, o, dout, dq, dk, dv;
  KernelArg lse;  // f32 [B, H, Tq], contiguous (as is the workspace's Di)
};

// attention, attention_grad, attention_qkv or attention_qkv_grad: its shape, attributes and where each tensor
// is; refuses head_dim > 128 and bad shards.
Result<AttnShape> attnShape(const Node& n);
// Prelude, q_t accessors for `dt`, the shape and row layouts as #defines (X_BASE(bh): the element offset of
// row 0 of head bh of tensor X, X_ST: its token stride) and drop_factor(seed, step, offb, offh, hg, bh, i, j).
// Where the node's block sits in the dropout index space (offB, offH, Hg) is no part of it: the kernels take it as
// arguments (dropArg), so the micro-batch copies of one attention, which differ only there, share their kernels.
std::string attnHead(const AttnShape& a, DType dt);
inline KernelArg dropArg(int64_t v) { return KernelArg{ArgKind::Int64, 0, v}; }
// attention_grad's first kernel: Di = rowsum(dout * out) (f32, a warp per row) into workspace offset 0.
KernelSpec attnDiKernel(const AttnShape& a, const std::string& head);

// Whether the tensor-core kernels take this op: bf16 or f16 q/k/v with head_dim a multiple of 16.
bool tensorCoreAttention(DType dt, const AttnShape& a);

// Whether `n` is attention_grad or attention_qkv_grad.
bool isAttentionBackward(const Node& n);

// The f32 CUDA-core kernels (every dtype and head_dim <= 128).
Result<NodeLowering> lowerAttentionSimt(const Node& n, const LoweringContext& ctx);
Result<NodeLowering> lowerAttentionGradSimt(const Node& n, const LoweringContext& ctx);
// The tensor-core kernels (only where tensorCoreAttention holds), with TcAttnOptions' defaults, or
// TcAttnOptions::narrow() where the environment has TPC_TC_ATTENTION=narrow, or the defaults with splitP
// where it has TPC_TC_ATTENTION=split (anything but wide, narrow or split is an error).
Result<NodeLowering> lowerAttentionTensorCore(const Node& n, const LoweringContext& ctx);
Result<NodeLowering> lowerAttentionGradTensorCore(const Node& n, const LoweringContext& ctx);
// Variants of the tensor-core kernels; the defaults ship, the others are for benchmarks (tpc_gpu_tests
// "[.bench]" times them side by side).
struct TcAttnOptions {
  // P (and dS) enter the P V style products as a 16-bit hi part plus a 16-bit residual, two mma each: the
  // products then carry ~16 mantissa bits of P like the f32 kernels, not bf16's 8. Off (the default: one
  // 16-bit P, FlashAttention-2's and PyTorch SDPA's numerics) the kernels are faster (H200, causal bf16
  // [16,12,1024,64]: forward 0.206 -> 0.174 ms, backward 0.615 -> 0.535; a 40-step gpt2 run 34.89 -> 33.45 ms
  // a step). Their gradients at T 1024 land up to 3.3e-2 off the f32 CPU backend in the kernel tests' metric,
  // where PyTorch's flash kernel on the same inputs lands at 3.8e-2 (head_dim 64) and 5.6e-2 (128)
  // (bench/attention_numerics.py, H200, 2026-12-03); the kernel tests hold one 16-bit P to 4e-2, split P to 1e-2.
  bool splitP = false;
  // The walked K/V (forward, dq) or Q/dout (dk/dv) tiles copied by cp.async into two buffers: the next tile
  // loads while the mma run on this one. Costs one more buffer per walked tile in shared memory.
  bool asyncCopy = true;
  // S = A B^T's fragments read by ldmatrix.x4 (a quarter of the shared-memory instructions of 32-bit loads);
  // the forward keeps its Q fragments in registers for the whole key walk, dk/dv (head_dim <= 64) its K and V.
  bool ldmatrix = true;
  // Each warp owns 32 rows (two m16 row groups; blocks of 128 rows) instead of 16, so that every fragment of
  // the walked tile read from shared memory feeds two mma, not one: the forward and dq kernels at every
  // head_dim, dk/dv at head_dim <= 64 (at 128 its dk and dv accumulators alone would take 256 registers).
  // A warp whose rows all lie above the causal diagonal of a tile skips it.
  bool wideWarps = true;
  // wideWarps in the backward kernels (dq, dk/dv) too. Off by default: on the H200 they were 2-4% slower
  // there than 16-row warps (causal bf16 [16,12,1024,64]: 0.640 vs 0.617 ms; [8,16,1024,128]: 0.793 vs
  // 0.780 ms), while the forward gained 3% (docs/performance.md).
  bool wideBackward = false;
  // Rows per walked tile: 0 picks per kernel (64 with 16-row warps; with wide warps the largest at which ptxas
  // reports no spills on sm_90: forward 64, 32 at head_dim 128; dq 32, 16 at head_dim 128; dk/dv 32), else 16,
  // 32 or 64.
  int walkRows = 0;
  // The forward's softmax takes exp2(s scale log2(e) - m) as one FFMA on the raw scores instead of a
  // scaling pass then a subtraction (only where scale > 0).
  bool fusedScale = true;
  // The forward rescales a warp's accumulators only when some row's running max moved (a warp vote); else
  // the factors are all 1 and the multiplies are skipped: the same results, fewer instructions per mma.
  bool lazyRescale = true;
  // The kernels before wideWarps, fusedScale and lazyRescale (16-row warps, 64-row tiles, split P), for
  // comparison.
  static TcAttnOptions narrow() {
    TcAttnOptions o;
    o.wideWarps = o.fusedScale = o.lazyRescale = false;
    o.splitP = true;
    return o;
  }
};
Result<NodeLowering> lowerAttentionTensorCore(const Node& n, const LoweringContext& ctx, const TcAttnOptions& o);
Result<NodeLowering> lowerAttentionGradTensorCore(const Node& n, const LoweringContext& ctx, const TcAttnOptions& o);

}  // namespace tpc::cuda
