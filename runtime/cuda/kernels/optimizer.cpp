// CUDA lowerings of the optimizer ops: adamw_update (elementwise; lr and step read from device scalars, so
// a captured CUDA graph replays with new values), a group of them as one multi-tensor kernel
// (adamw_groups.h), and clip_scale (one thread). global_norm and sum_squares are reductions (reduction.cpp).
#include "runtime/cuda/kernels/device_prelude.h"
#include "runtime/cuda/kernels/family_lowerings.h"
#include "runtime/cuda/kernels/kernel_source.h"
#include "runtime/cuda/kernels/multi_tensor.h"
#include "runtime/cuda/adamw_groups.h"

namespace tpc::cuda {
namespace {

// One element of the update, shared by both kernels so that they compute the same bits.
const char* kAdamWElement = R"(
__device__ __forceinline__ void tpc_adamw(float p, float g, float& m, float& v, float& po, float c1, float c2,
    float rate, float b1, float omb1, float b2, float omb2, float eps, float wd) {
  m = b1 * m + omb1 * g;
  v = b2 * v + omb2 * g * g;
  float mhat = m / c1, vhat = v / c2;
  po = p - rate * (mhat / (sqrtf(vhat) + eps) + wd * p);
}
)";

}  // namespace

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
  src += kAdamWElement;
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
    float m = m_ld(M, i), v = v_ld(V, i), po;
    tpc_adamw(p_ld(P, i), g_ld(G, i), m, v, po, c1, c2, rate, b1, omb1, b2, omb2, eps, wd);
    po_st(PO, i, po);
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

namespace {

// `name`_ld4 / `name`_st4: elements i..i+3 of a buffer, as one 16-byte access for f32 and one 8-byte access for
// bf16/f16 (i a multiple of 4, the buffer 16-byte aligned: the caller checks).
std::string quadAccessors(const std::string& name, DType t) {
  if (t == DType::f32)
    return cat("__device__ __forceinline__ void ", name, "_ld4(const ", name, "_t* p, i64 i, float* o) {\n",
               "  uint4 r = *reinterpret_cast<const uint4*>(p + i);\n",
               "  o[0] = __uint_as_float(r.x); o[1] = __uint_as_float(r.y); o[2] = __uint_as_float(r.z); o[3] = __uint_as_float(r.w);\n}\n",
               "__device__ __forceinline__ void ", name, "_st4(", name, "_t* p, i64 i, const float* v) {\n",
               "  uint4 r;\n  r.x = __float_as_uint(v[0]); r.y = __float_as_uint(v[1]); r.z = __float_as_uint(v[2]); r.w = __float_as_uint(v[3]);\n",
               "  *reinterpret_cast<uint4*>(p + i) = r;\n}\n");
  const bool bf = t == DType::bf16;
  auto lo = [&](const char* w) { return bf ? cat("__uint_as_float(", w, " << 16)") : cat("tpc_f16_to_f32((f16_t)(", w, " & 0xffffu))"); };
  auto hi = [&](const char* w) { return bf ? cat("__uint_as_float(", w, " & 0xffff0000u)") : cat("tpc_f16_to_f32((f16_t)(", w, " >> 16))"); };
  const char* cv = bf ? "tpc_f32_to_bf16" : "tpc_f32_to_f16";
  return cat("__device__ __forceinline__ void ", name, "_ld4(const ", name, "_t* p, i64 i, float* o) {\n",
             "  uint2 r = *reinterpret_cast<const uint2*>(p + i);\n",
             "  o[0] = ", lo("r.x"), "; o[1] = ", hi("r.x"), "; o[2] = ", lo("r.y"), "; o[3] = ", hi("r.y"), ";\n}\n",
             "__device__ __forceinline__ void ", name, "_st4(", name, "_t* p, i64 i, const float* v) {\n",
             "  uint2 r;\n  r.x = (u32)", cv, "(v[0]) | ((u32)", cv, "(v[1]) << 16);\n",
             "  r.y = (u32)", cv, "(v[2]) | ((u32)", cv, "(v[3]) << 16);\n",
             "  *reinterpret_cast<uint2*>(p + i) = r;\n}\n");
}

std::string floatList(const std::vector<double>& v) {
  std::string s;
  for (size_t k = 0; k < v.size(); ++k) s += (k ? ", " : "") + floatLit(v[k]);
  return s;
}

}  // namespace

// Blocks over the chunks of every tensor (each tensor's elements cut into chunks of kChunk, a block per
// chunk, as apex's multi_tensor_apply): a block finds its tensor in a table baked into the source, its
// addresses in the device table the executor writes at prepare (7 per tensor: p, g, m, v, p', m', v'; 8 with
// the 16-bit copy c, adamw_groups.h).
// Per element, lowerAdamWUpdate's formula operation for operation, so the results are the same bits.
// Gated: when the hold word is set (checking mode) or a gate (the step's loss, grad_norm) is not finite,
// the state is left as it was, and a result that is not written in place gets the old value.
Result<NodeLowering> lowerAdamWGroup(const FusionGroup& g, const LoweringContext& ctx) {
  constexpr int64_t kChunk = 4096;
  const bool scales = adamwGroupScales(g);
  const size_t fixedInputs = 4 * g.members.size() + 2 + (scales ? 1 : 0);
  const bool copies = adamwGroupKeepsCopies(g);  // outputs p', m', v' and the 16-bit copy c of each member
  const unsigned results = copies ? 4 : 3, slots = 4 + results;
  if (!isAdamWGroup(g) || g.inputs.size() < fixedInputs || (g.outputs.size() != 3 * g.members.size() && !copies))
    return makeError("adamw group: not a group of adamw_update nodes in adamw_groups.h's layout");
  const Node& n0 = *g.members.front();
  const char* names[] = {"p", "g", "m", "v", "po", "mo", "vo", "c"};
  // A member's types: p, g, m, v as the group reads them (g may be the bf16 source of an absorbed cast), results.
  auto typeOf = [&](size_t member, unsigned k) {
    return k < 4 ? g.inputs[4 * member + k]->dtype() : g.outputs[results * member + (k - 4)]->dtype();
  };
  std::string src = devicePrelude();
  for (unsigned k = 0; k < slots; ++k) {
    DType t = typeOf(0, k);
    TPC_TRY(checkFloatDType(n0, t, "param, grad, m and v"));
    src += accessors(names[k], t) + quadAccessors(names[k], t);
  }
  const size_t gates = adamwGroupGates(g);
  std::string gateParams, gateTest;
  for (size_t k = 0; k < gates; ++k) {
    const Value* v = g.inputs[fixedInputs + k];
    TPC_TRY(checkFloatDType(n0, v->dtype(), "the loss and grad_norm it is gated by"));
    src += accessors(cat("gate", k), v->dtype());
    gateParams += cat(", const gate", k, "_t* gate", k);
    gateTest += cat(" || !tpc_finite(gate", k, "_ld(gate", k, ", 0))");
  }
  std::vector<int64_t> numel;
  std::vector<double> wd;
  for (size_t j = 0; j < g.members.size(); ++j) {
    const Node* n = g.members[j];
    for (unsigned k = 0; k < slots; ++k)
      if (typeOf(j, k) != typeOf(0, k)) return makeError("adamw group: members of different dtypes");
    if (copies && g.outputs[4 * j + 3]->type().numel() != n->operand(0)->type().numel())
      return makeError("adamw group: member ", j, "'s 16-bit copy is not its parameter's size");
    numel.push_back(n->operand(0)->type().numel());
    wd.push_back(n->getFloat("weight_decay"));
  }
  const int64_t chunks = multiTensorChunkCount(numel, kChunk), T = static_cast<int64_t>(g.members.size());
  double b1 = n0.getFloat("beta1"), b2 = n0.getFloat("beta2");
  src += kAdamWElement;
  src += multiTensorChunks(numel, kChunk);
  src += cat(R"(
__device__ const float tpc_wd[NT] = {)", floatList(wd), R"(};
__device__ __forceinline__ bool tpc_finite(float x) { return (__float_as_uint(x) & 0x7f800000u) != 0x7f800000u; }
extern "C" __global__ void tpc_adamw_multi(const u64* table, const float* lr, const float* step, const int* hold)",
             scales ? ", const float* gscale" : "", gateParams, R"() {
  __shared__ float sc[4];
  __shared__ int skip, tensor;
  if (threadIdx.x == 0) {
    double t = (double)step[0];
    sc[0] = (float)(1.0 - pow()", doubleLit(b1), R"(, t));
    sc[1] = (float)(1.0 - pow()", doubleLit(b2), R"(, t));
    sc[2] = lr[0];
    sc[3] = )", scales ? "gscale[0]" : "1.f", R"(;
    skip = hold[0] != 0)", gateTest, R"(;
    tensor = tpc_tensor_of(blockIdx.x);
  }
  __syncthreads();
  const int k = tensor;
  const i64 begin = ((i64)blockIdx.x - tpc_first[k]) * CHUNK;
  const i64 end = begin + CHUNK < tpc_numel[k] ? begin + CHUNK : tpc_numel[k];
  const u64* a = table + )", slots, R"( * k;
  const p_t* P = (const p_t*)a[0];
  const g_t* G = (const g_t*)a[1];
  const m_t* M = (const m_t*)a[2];
  const v_t* V = (const v_t*)a[3];
  po_t* PO = (po_t*)a[4];
  mo_t* MO = (mo_t*)a[5];
  vo_t* VO = (vo_t*)a[6];)", copies ? R"(
  c_t* C = (c_t*)a[7];  // cast(p'): the next step's 16-bit copy (a skipped step leaves it, as it leaves p))" : "", R"(
  if (skip) {
    for (i64 i = begin + threadIdx.x; i < end; i += blockDim.x) {
      if (a[4] != a[0]) PO[i] = P[i];
      if (a[5] != a[2]) MO[i] = M[i];
      if (a[6] != a[3]) VO[i] = V[i];
    }
    return;
  }
  const float c1 = sc[0], c2 = sc[1], rate = sc[2];
  // The absorbed clip multiply: the same f32 product the mul kernel wrote (__fmul_rn: never fused into an fma).
#define GS(x) )", scales ? "__fmul_rn((x), sc[3])" : "(x)", R"(
  const float b1 = )", floatLit(b1), ", omb1 = ", floatLit(1 - b1), ", b2 = ", floatLit(b2), ", omb2 = ", floatLit(1 - b2),
             ", eps = ", floatLit(n0.getFloat("eps")), R"(, wd = tpc_wd[k];
  i64 tail = begin;
  if (((a[0] | a[1] | a[2] | a[3] | a[4] | a[5] | a[6])", copies ? " | a[7]" : "", R"() & 15) == 0) {
    for (i64 i = begin + 4 * threadIdx.x; i + 4 <= end; i += 4 * (i64)blockDim.x) {
      float p[4], g[4], m[4], v[4], po[4];
      p_ld4(P, i, p);
      g_ld4(G, i, g);
      m_ld4(M, i, m);
      v_ld4(V, i, v);
#pragma unroll
      for (int j = 0; j < 4; ++j) tpc_adamw(p[j], GS(g[j]), m[j], v[j], po[j], c1, c2, rate, b1, omb1, b2, omb2, eps, wd);
      po_st4(PO, i, po);
      mo_st4(MO, i, m);
      vo_st4(VO, i, v);)", copies ? R"(
      c_st4(C, i, po);)" : "", R"(
    }
    tail = begin + (end - begin) / 4 * 4;
  }
  for (i64 i = tail + threadIdx.x; i < end; i += blockDim.x) {
    float m = m_ld(M, i), v = v_ld(V, i), po;
    tpc_adamw(p_ld(P, i), GS(g_ld(G, i)), m, v, po, c1, c2, rate, b1, omb1, b2, omb2, eps, wd);
    po_st(PO, i, po);
    mo_st(MO, i, m);
    vo_st(VO, i, v);)", copies ? R"(
    c_st(C, i, po);)" : "", R"(
  }
}
)");
  KernelSpec k;
  k.entry = "tpc_adamw_multi";
  k.source = std::move(src);
  k.block.x = 256;
  k.grid.x = static_cast<uint32_t>(std::max<int64_t>(chunks, 1));
  k.tables.push_back(multiTensorAddressTable(T, 4, results));
  k.args.push_back(KernelArg{ArgKind::Table, 0});
  k.args.push_back(operandArg(4 * T));
  k.args.push_back(operandArg(4 * T + 1));
  k.args.push_back(KernelArg{ArgKind::HoldPtr});
  if (scales) k.args.push_back(operandArg(4 * T + 2));
  for (size_t j = 0; j < gates; ++j) k.args.push_back(operandArg(static_cast<int64_t>(fixedInputs + j)));
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
