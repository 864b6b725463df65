// CUDA lowerings of the optimizer ops: adamw_update (elementwise; lr and step read from device scalars, so
// a captured CUDA graph replays with new values) and clip_scale (one thread). global_norm and sum_squares
// are reductions (reduction.cpp).
#include "runtime/cuda/kernels/device_prelude.h"
#include "runtime/cuda/kernels/family_lowerings.h"
#include "runtime/cuda/kernels/kernel_source.h"

namespace tpc::cuda {

// The CPU formula (runtime/cpu/optimizer.cpp, T = float), operation for operation: c1 and c2 in double,
// everything else in float. A step < 1 gives inf/nan parameters (the CPU backend refuses it instead).
Result<NodeLowering> lowerAdamWUpdate(const Node& n, const LoweringContext& ctx) {
  const char* names[] = {"p", "g", "m", "v"};
  for (unsigned k = 0; k < 4; ++k) TPC_TRY(checkFloatDType(n, n.operand(k)->dtype(), "param, grad, m and v"));
  std::string src = devicePrelude();
  for (unsigned k = 0; k < 4; ++k) src += accessors(names[k], n.operand(k)->dtype());
  src += accessors("po", n.result(0)->dtype()) + accessors("mo", n.result(1)->dtype()) +
         accessors("vo", n.result(2)->dtype());
  double b1 = n.getFloat("beta1"), b2 = n.getFloat("beta2");
  int64_t count = n.operand(0)->type().numel();
  src += cat(R"(
extern "C" __global__ void tpc_adamw_update(const p_t* P, const g_t* G, const m_t* M, const v_t* V,
    const float* lr, const float* step, po_t* PO, mo_t* MO, vo_t* VO) {
  __shared__ float sc[3];
  if (threadIdx.x == 0) {
    double t = (double)step[0];
    sc[0] = (float)(1.0 - pow()", doubleLit(b1), R"(, t));
    sc[1] = (float)(1.0 - pow()", doubleLit(b2), R"(, t));
    sc[2] = lr[0];
  }
  __syncthreads();
  const float c1 = sc[0], c2 = sc[1], rate = sc[2];
  const float b1 = )", floatLit(b1), ", omb1 = ", floatLit(1 - b1), ", b2 = ", floatLit(b2), ", omb2 = ", floatLit(1 - b2),
             ", eps = ", floatLit(n.getFloat("eps")), ", wd = ", floatLit(n.getFloat("weight_decay")), R"(;
  for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < )", i64Lit(count), R"(; i += (i64)gridDim.x * blockDim.x) {
    float g = g_ld(G, i), p = p_ld(P, i);
    float m = b1 * m_ld(M, i) + omb1 * g;
    float v = b2 * v_ld(V, i) + omb2 * g * g;
    float mhat = m / c1, vhat = v / c2;
    po_st(PO, i, p - rate * (mhat / (sqrtf(vhat) + eps) + wd * p));
    mo_st(MO, i, m);
    vo_st(VO, i, v);
  }
}
)");
  KernelSpec k;
  k.entry = "tpc_adamw_update";
  k.source = std::move(src);
  k.block.x = 256;
  k.grid.x = gridFor(count, 256, 8192);
  for (int a = 0; a < 6; ++a) k.args.push_back(operandArg(a));
  for (int r = 0; r < 3; ++r) k.args.push_back(resultArg(r));
  NodeLowering out;
  out.kernels.push_back(std::move(k));
  return out;
}

// min(1, max_norm / (norm + 1e-6)), in double like the CPU kernel.
Result<NodeLowering> lowerClipScale(const Node& n, const LoweringContext& ctx) {
  KernelSpec k;
  k.entry = "tpc_clip_scale";
  k.source = devicePrelude() + cat(R"(
extern "C" __global__ void tpc_clip_scale(const float* norm, float* out) {
  if (blockIdx.x == 0 && threadIdx.x == 0) out[0] = (float)fmin(1.0, )", doubleLit(n.getFloat("max_norm")),
                                   R"( / ((double)norm[0] + 1e-6));
}
)");
  k.block.x = 32;
  k.args = {operandArg(0), resultArg(0)};
  NodeLowering out;
  out.kernels.push_back(std::move(k));
  return out;
}

}  // namespace tpc::cuda
