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

// "u64 in0, ..., u64 in{G-1}" (and ", u64 out0, ..., u64 out{G-1}" with outs): a group's device addresses.
std::string groupPointers(int G, bool outs) {
  std::string sig;
  for (int q = 0; q < G; ++q) sig += cat(q ? ", " : "", "u64 in", q);
  for (int q = 0; outs && q < G; ++q) sig += cat(", u64 out", q);
  return sig;
}

// A kernel `prefix`(sig) whose threads stride over i < n running `loop`; the caller appends its arguments.
KernelSpec gridStrideKernel(const std::string& prefix, const std::string& sig, const std::string& loop, int64_t n) {
  std::string body = "(" + sig + ") {\n  for (i64 i = blockIdx.x * (i64)blockDim.x + threadIdx.x; i < n; i += (i64)gridDim.x * blockDim.x) {\n" +
                     loop + "  }\n}\n";
  KernelSpec k;
  k.entry = entryName(prefix, body);
  k.source = withPrelude("extern \"C\" __global__ void " + k.entry + body);
  elementwiseGeometry(k, n);
  return k;
}

}  // namespace

KernelSpec virtualAllReduce(DType t, int G, bool max, int64_t numel) {
  std::string loop = reduceLoop(t, G, max, "i");
  for (int q = 0; q < G; ++q) loop += "    " + store(t, cat("((", ctype(t), "*)out", q, ") + i"), "acc") + "\n";
  KernelSpec k = gridStrideKernel("tpc_vall_reduce", groupPointers(G, true) + ", i64 n", loop, numel);
  for (int q = 0; q < 2 * G; ++q) k.args.push_back({ArgKind::Int64, 0, 0});
  k.args.push_back({ArgKind::Int64, 0, numel});
  return k;
}

KernelSpec virtualReduceScatter(DType t, int G, bool max, llvm::ArrayRef<int64_t> inShape, int64_t dim, int rank) {
  std::vector<int64_t> out(inShape.begin(), inShape.end());
  out[dim] /= G;
  std::vector<int64_t> ins = strides(inShape);
  size_t r = out.size();
  std::string sig = groupPointers(G, false) + ", u64 out, i64 n, i64 base";
  for (size_t d = 0; d < r; ++d) sig += cat(", i64 d", d, ", i64 s", d);
  std::string loop = "    i64 rem = i, o = base;\n";
  for (size_t d = r; d-- > 0;) loop += cat("    { i64 q = rem % d", d, "; rem /= d", d, "; o += q * s", d, "; }\n");
  loop += reduceLoop(t, G, max, "o") + "    " + store(t, cat("((", ctype(t), "*)out) + i"), "acc") + "\n";
  int64_t n = 1;
  for (int64_t d : out) n *= d;
  KernelSpec k = gridStrideKernel("tpc_vreduce_scatter", sig, loop, n);
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
  // Output element i = (o, j, k) over [outer, G len, inner]: shard q = j / len, its element (o, j % len, k).
  std::string loop = cat("    i64 k = i % inner, j = (i / inner) % (", G, " * len), o = i / (inner * ", G,
                         " * len);\n    i64 q = j / len, src = (o * len + j % len) * inner + k;\n    u64 in = in0;\n");
  for (int q = 1; q < G; ++q) loop += cat("    if (q == ", q, ") in = in", q, ";\n");
  loop += "    " + ctype(t) + " v = ((const " + ctype(t) + "*)in)[src];\n";
  for (int q = 0; q < G; ++q) loop += cat("    ((", ctype(t), "*)out", q, ")[i] = v;\n");
  KernelSpec k = gridStrideKernel("tpc_vall_gather", groupPointers(G, true) + ", i64 n, i64 len, i64 inner", loop, n);
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
