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
