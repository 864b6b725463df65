// Kernels for virtual-rank collectives (see virtual_collectives.h).
#include "runtime/cuda/virtual_collectives.h"

#include "runtime/cuda/kernels/codegen.h"

namespace tpc::cuda {

using namespace codegen;

namespace {

std::string reduceLoop(DType t, int G, bool max, const std::string& index) {
  std::string C = computeType(t), s;
  s += "    " + C + " acc = " + load(t, "((const " + ctype(t) + "*)in0) + " + index) + ";\n";
  for (int q = 1; q < G; ++q) {
    std::string v = load(t, cat("((const ", ctype(t), "*)in", q, ") + ", index));
    s += max ? cat("    { ", C, " v = ", v, "; acc = acc > v ? acc : v; }\n") : cat("    acc += ", v, ";\n");
  }
  return s;
}

}  // namespace

KernelSpec virtualAllReduce(DType t, int G, bool max, int64_t numel) {
  std::string sig;
  for (int q = 0; q < G; ++q) sig += cat(q ? ", " : "", "u64 in", q);
  for (int q = 0; q < G; ++q) sig += cat(", u64 out", q);
  sig += ", i64 n";
  std::string body = "(" + sig + ") {\n  for (i64 i = blockIdx.x * (i64)blockDim.x + threadIdx.x; i < n; i += (i64)gridDim.x * blockDim.x) {\n" +
                     reduceLoop(t, G, max, "i");
  for (int q = 0; q < G; ++q) body += "    " + store(t, cat("((", ctype(t), "*)out", q, ") + i"), "acc") + "\n";
  body += "  }\n}\n";
  KernelSpec k;
  k.entry = entryName("tpc_vall_reduce", body);
  k.source = withPrelude("extern \"C\" __global__ void " + k.entry + body);
  elementwiseGeometry(k, numel);
  for (int q = 0; q < 2 * G; ++q) k.args.push_back({ArgKind::Int64, 0, 0});
  k.args.push_back({ArgKind::Int64, 0, numel});
  return k;
}

KernelSpec virtualReduceScatter(DType t, int G, bool max, llvm::ArrayRef<int64_t> inShape, int64_t dim, int rank) {
  std::vector<int64_t> out(inShape.begin(), inShape.end());
  out[dim] /= G;
  std::vector<int64_t> ins = strides(inShape);
  size_t r = out.size();
  std::string sig;
  for (int q = 0; q < G; ++q) sig += cat(q ? ", " : "", "u64 in", q);
  sig += ", u64 out, i64 n, i64 base";
  for (size_t d = 0; d < r; ++d) sig += cat(", i64 d", d, ", i64 s", d);
  std::string idx = "    i64 rem = i, o = base;\n";
  for (size_t d = r; d-- > 0;) idx += cat("    { i64 q = rem % d", d, "; rem /= d", d, "; o += q * s", d, "; }\n");
  std::string body = "(" + sig + ") {\n  for (i64 i = blockIdx.x * (i64)blockDim.x + threadIdx.x; i < n; i += (i64)gridDim.x * blockDim.x) {\n" +
                     idx + reduceLoop(t, G, max, "o") + "    " + store(t, cat("((", ctype(t), "*)out) + i"), "acc") +
                     "\n  }\n}\n";
  KernelSpec k;
  k.entry = entryName("tpc_vreduce_scatter", body);
  k.source = withPrelude("extern \"C\" __global__ void " + k.entry + body);
  int64_t n = 1;
  for (int64_t d : out) n *= d;
  elementwiseGeometry(k, n);
  for (int q = 0; q < G + 1; ++q) k.args.push_back({ArgKind::Int64, 0, 0});
  k.args.push_back({ArgKind::Int64, 0, n});
  k.args.push_back({ArgKind::Int64, 0, rank * out[dim] * ins[dim]});
  for (size_t d = 0; d < r; ++d) {
    k.args.push_back({ArgKind::Int64, 0, out[d]});
    k.args.push_back({ArgKind::Int64, 0, ins[d]});
  }
  return k;
}

KernelSpec virtualAllGather(DType t, int G, llvm::ArrayRef<int64_t> inShape, int64_t dim) {
  int64_t outer = 1, inner = 1, len = inShape[dim];
  for (int64_t d = 0; d < dim; ++d) outer *= inShape[d];
  for (size_t d = static_cast<size_t>(dim) + 1; d < inShape.size(); ++d) inner *= inShape[d];
  const int64_t n = outer * G * len * inner;
  std::string sig;
  for (int q = 0; q < G; ++q) sig += cat(q ? ", " : "", "u64 in", q);
  for (int q = 0; q < G; ++q) sig += cat(", u64 out", q);
  sig += ", i64 n, i64 len, i64 inner";
  // Output element i = (o, j, k) over [outer, G len, inner]: shard q = j / len, its element (o, j % len, k).
  std::string body = "(" + sig + ") {\n  for (i64 i = blockIdx.x * (i64)blockDim.x + threadIdx.x; i < n; i += (i64)gridDim.x * blockDim.x) {\n" +
                     "    i64 k = i % inner, j = (i / inner) % (" + std::to_string(G) + " * len), o = i / (inner * " +
                     std::to_string(G) + " * len);\n    i64 q = j / len, src = (o * len + j % len) * inner + k;\n    u64 in = in0;\n";
  for (int q = 1; q < G; ++q) body += cat("    if (q == ", q, ") in = in", q, ";\n");
  body += "    " + ctype(t) + " v = ((const " + ctype(t) + "*)in)[src];\n";
  for (int q = 0; q < G; ++q) body += cat("    ((", ctype(t), "*)out", q, ")[i] = v;\n");
  body += "  }\n}\n";
  KernelSpec k;
  k.entry = entryName("tpc_vall_gather", body);
  k.source = withPrelude("extern \"C\" __global__ void " + k.entry + body);
  elementwiseGeometry(k, n);
  for (int q = 0; q < 2 * G; ++q) k.args.push_back({ArgKind::Int64, 0, 0});
  k.args.push_back({ArgKind::Int64, 0, n});
  k.args.push_back({ArgKind::Int64, 0, len});
  k.args.push_back({ArgKind::Int64, 0, inner});
  return k;
}

KernelSpec virtualAllGatherPiece(DType t, llvm::ArrayRef<int64_t> inShape, llvm::ArrayRef<int64_t> outShape, int64_t dim,
                                 int q) {
  std::vector<int64_t> src = strides(inShape), dst = strides(outShape);
  return stridedCopy(t, inShape, q * inShape[dim] * dst[dim], dst, 0, src, {ArgKind::Int64, 0, 0}, {ArgKind::Int64, 0, 0});
}

}  // namespace tpc::cuda
