#include "runtime/cuda/kernels/kernel_source.h"

#include <algorithm>
#include <cstdio>

namespace tpc::cuda {

std::string accessors(const std::string& name, DType t) {
  std::string ty = name + "_t";
  switch (t) {
    case DType::f32:
      return cat("typedef float ", ty, ";\n__device__ __forceinline__ float ", name, "_ld(const ", ty,
                 "* p, i64 i) { return p[i]; }\n__device__ __forceinline__ void ", name, "_st(", ty,
                 "* p, i64 i, float v) { p[i] = v; }\n");
    case DType::bf16:
      return cat("typedef bf16_t ", ty, ";\n__device__ __forceinline__ float ", name, "_ld(const ", ty,
                 "* p, i64 i) { return tpc_bf16_to_f32(p[i]); }\n__device__ __forceinline__ void ", name, "_st(", ty,
                 "* p, i64 i, float v) { p[i] = tpc_f32_to_bf16(v); }\n");
    case DType::f16:
      return cat("typedef f16_t ", ty, ";\n__device__ __forceinline__ float ", name, "_ld(const ", ty,
                 "* p, i64 i) { return tpc_f16_to_f32(p[i]); }\n__device__ __forceinline__ void ", name, "_st(", ty,
                 "* p, i64 i, float v) { p[i] = tpc_f32_to_f16(v); }\n");
    case DType::i32:
      return cat("typedef i32 ", ty, ";\n__device__ __forceinline__ i64 ", name, "_ld(const ", ty,
                 "* p, i64 i) { return (i64)p[i]; }\n");
    case DType::i64:
      return cat("typedef i64 ", ty, ";\n__device__ __forceinline__ i64 ", name, "_ld(const ", ty,
                 "* p, i64 i) { return p[i]; }\n");
    default: return "#error unsupported dtype for " + name + "\n";
  }
}

std::string vectorAccessors(const std::string& name, DType t) {
  std::string ld = cat("__device__ __forceinline__ void ", name, "_ld8(const ", name, "_t* p, i64 i, float* v) {\n");
  std::string st = cat("__device__ __forceinline__ void ", name, "_st8(", name, "_t* p, i64 i, const float* v) {\n");
  if (t == DType::f32) {
    ld += "  const uint4* q = reinterpret_cast<const uint4*>(p + i);\n  uint4 a = q[0], b = q[1];\n"
          "  v[0] = __uint_as_float(a.x); v[1] = __uint_as_float(a.y); v[2] = __uint_as_float(a.z); v[3] = __uint_as_float(a.w);\n"
          "  v[4] = __uint_as_float(b.x); v[5] = __uint_as_float(b.y); v[6] = __uint_as_float(b.z); v[7] = __uint_as_float(b.w);\n}\n";
    st += "  uint4 a, b;\n"
          "  a.x = __float_as_uint(v[0]); a.y = __float_as_uint(v[1]); a.z = __float_as_uint(v[2]); a.w = __float_as_uint(v[3]);\n"
          "  b.x = __float_as_uint(v[4]); b.y = __float_as_uint(v[5]); b.z = __float_as_uint(v[6]); b.w = __float_as_uint(v[7]);\n"
          "  uint4* q = reinterpret_cast<uint4*>(p + i);\n  q[0] = a;\n  q[1] = b;\n}\n";
    return ld + st;
  }
  bool bf = t == DType::bf16;
  std::string lo = bf ? "__uint_as_float(w[k] << 16)" : "tpc_f16_to_f32((f16_t)(w[k] & 0xffffu))";
  std::string hi = bf ? "__uint_as_float(w[k] & 0xffff0000u)" : "tpc_f16_to_f32((f16_t)(w[k] >> 16))";
  std::string cv = bf ? "tpc_f32_to_bf16" : "tpc_f32_to_f16";
  ld += cat("  uint4 a = *reinterpret_cast<const uint4*>(p + i);\n  u32 w[4] = {a.x, a.y, a.z, a.w};\n"
            "#pragma unroll\n  for (int k = 0; k < 4; ++k) { v[2 * k] = ", lo, "; v[2 * k + 1] = ", hi, "; }\n}\n");
  st += cat("  u32 w[4];\n#pragma unroll\n  for (int k = 0; k < 4; ++k) w[k] = (u32)", cv, "(v[2 * k]) | ((u32)", cv,
            "(v[2 * k + 1]) << 16);\n  uint4 a;\n  a.x = w[0]; a.y = w[1]; a.z = w[2]; a.w = w[3];\n"
            "  *reinterpret_cast<uint4*>(p + i) = a;\n}\n");
  return ld + st;
}

Status checkFloatDType(const Node& n, DType t, const char* what) {
  if (t == DType::f32 || t == DType::bf16 || t == DType::f16) return {};
  return makeError(n.opName(), ": the CUDA kernel takes ", what, " in f32, bf16 or f16, got ", dtypeName(t));
}
Status checkIdDType(const Node& n, DType t, const char* what) {
  if (t == DType::i32 || t == DType::i64) return {};
  return makeError(n.opName(), ": the CUDA kernel takes ", what, " as i32 or i64, got ", dtypeName(t));
}

std::string floatLit(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.9ef", static_cast<float>(v));
  return buf;
}
std::string doubleLit(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.17e", v);
  return buf;
}
std::string i64Lit(int64_t v) { return cat(v, "ll"); }

uint32_t gridFor(int64_t n, uint32_t block, int64_t maxBlocks) {
  int64_t b = (n + block - 1) / block;
  return static_cast<uint32_t>(std::clamp<int64_t>(b, 1, maxBlocks));
}

uint32_t rowBlock(int64_t n, uint32_t maxThreads) {
  uint32_t b = 32;
  while (b < maxThreads && b < n) b *= 2;
  return b;
}

int64_t prodDims(const Shape& s, size_t b, size_t e) {
  int64_t p = 1;
  for (size_t k = b; k < e && k < s.size(); ++k) p *= s[k];
  return p;
}

}  // namespace tpc::cuda
