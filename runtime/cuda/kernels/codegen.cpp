// Generated-CUDA-C helpers (see codegen.h).
#include "runtime/cuda/kernels/codegen.h"

#include <algorithm>
#include <cstdio>

#include "runtime/cuda/kernels/device_prelude.h"

namespace tpc::cuda::codegen {

std::string ctype(DType t) {
  switch (t) {
    case DType::f32: return "float";
    case DType::f64: return "double";
    case DType::f16: return "f16_t";
    case DType::bf16: return "bf16_t";
    case DType::i32: return "i32";
    case DType::i64: return "i64";
    case DType::boolean: return "u8";
  }
  return "float";
}

std::string computeType(DType t) {
  if (t == DType::f64) return "double";
  if (isFloat(t)) return "float";
  return "i64";
}

std::string load(DType t, const std::string& p) {
  switch (t) {
    case DType::bf16: return "tpc_bf16_to_f32(*(" + p + "))";
    case DType::f16: return "tpc_f16_to_f32(*(" + p + "))";
    case DType::f32:
    case DType::f64: return "(*(" + p + "))";
    default: return "((i64)(*(" + p + ")))";
  }
}

std::string store(DType t, const std::string& p, const std::string& v) {
  switch (t) {
    case DType::bf16: return "*(" + p + ") = tpc_f32_to_bf16((float)(" + v + "));";
    case DType::f16: return "*(" + p + ") = tpc_f32_to_f16((float)(" + v + "));";
    case DType::boolean: return "*(" + p + ") = (u8)((" + v + ") != 0);";
    default: return "*(" + p + ") = (" + ctype(t) + ")(" + v + ");";
  }
}

std::string roundTrip(DType t, const std::string& v) {
  switch (t) {
    case DType::bf16: return "tpc_bf16_to_f32(tpc_f32_to_bf16((float)(" + v + ")))";
    case DType::f16: return "tpc_f16_to_f32(tpc_f32_to_f16((float)(" + v + ")))";
    case DType::f32: return "(float)(" + v + ")";
    case DType::f64: return "(double)(" + v + ")";
    case DType::i32: return "(i64)(i32)(" + v + ")";
    case DType::boolean: return "(i64)((" + v + ") != 0)";
    default: return "(i64)(" + v + ")";
  }
}

std::string withPrelude(const std::string& body) { return devicePrelude() + body; }

void elementwiseGeometry(KernelSpec& k, int64_t n) {
  int64_t blocks = std::clamp<int64_t>((n + 255) / 256, 1, 132 * 16);
  k.grid = {static_cast<uint32_t>(blocks), 1, 1};
  k.block = {256, 1, 1};
}

std::string entryName(const std::string& prefix, const std::string& body) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : body) {
    h ^= c;
    h *= 1099511628211ull;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, "_%012llx", static_cast<unsigned long long>(h & 0xffffffffffffull));
  return prefix + buf;
}

std::vector<int64_t> strides(llvm::ArrayRef<int64_t> shape) {
  std::vector<int64_t> s(shape.size());
  int64_t acc = 1;
  for (size_t k = shape.size(); k-- > 0;) {
    s[k] = acc;
    acc *= shape[k];
  }
  return s;
}

std::vector<int64_t> broadcastStrides(llvm::ArrayRef<int64_t> shape, llvm::ArrayRef<int64_t> out) {
  std::vector<int64_t> s(out.size(), 0), own = strides(shape);
  size_t off = out.size() - shape.size();
  for (size_t k = 0; k < shape.size(); ++k) s[off + k] = shape[k] == 1 ? 0 : own[k];
  return s;
}

KernelSpec stridedCopy(DType t, llvm::ArrayRef<int64_t> dims, int64_t dbase, llvm::ArrayRef<int64_t> ds, int64_t sbase,
                       llvm::ArrayRef<int64_t> ss, KernelArg dst, KernelArg src) {
  size_t r = dims.size();
  bool raw = dst.kind == ArgKind::Int64;
  std::string T = ctype(t);
  std::string sig, idx;
  if (raw) sig = "u64 dst_addr, u64 src_addr";
  else sig = T + "* dst, const " + T + "* src";
  sig += ", i64 n, i64 dbase, i64 sbase";
  for (size_t k = 0; k < r; ++k) sig += ", i64 d" + std::to_string(k);
  for (size_t k = 0; k < r; ++k) sig += ", i64 ds" + std::to_string(k);
  for (size_t k = 0; k < r; ++k) sig += ", i64 ss" + std::to_string(k);
  for (size_t k = r; k-- > 0;) {
    std::string K = std::to_string(k);
    idx += "    { i64 q = rem % d" + K + "; rem /= d" + K + "; od += q * ds" + K + "; os += q * ss" + K + "; }\n";
  }
  std::string body = "(" + sig + ") {\n";
  if (raw) body += "  " + T + "* dst = (" + T + "*)dst_addr; const " + T + "* src = (const " + T + "*)src_addr;\n";
  body += "  for (i64 i = blockIdx.x * (i64)blockDim.x + threadIdx.x; i < n; i += (i64)gridDim.x * blockDim.x) {\n"
          "    i64 rem = i, od = dbase, os = sbase;\n" + idx +
          "    dst[od] = src[os];\n  }\n}\n";
  KernelSpec k;
  k.entry = entryName("tpc_copy", body);
  k.source = withPrelude("extern \"C\" __global__ void " + k.entry + body);
  int64_t n = 1;
  for (int64_t d : dims) n *= d;
  elementwiseGeometry(k, n);
  k.args = {dst, src, {ArgKind::Int64, 0, n}, {ArgKind::Int64, 0, dbase}, {ArgKind::Int64, 0, sbase}};
  for (int64_t d : dims) k.args.push_back({ArgKind::Int64, 0, d});
  for (int64_t d : ds) k.args.push_back({ArgKind::Int64, 0, d});
  for (int64_t d : ss) k.args.push_back({ArgKind::Int64, 0, d});
  return k;
}

}  // namespace tpc::cuda::codegen
