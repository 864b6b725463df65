// CUDA lowerings of embedding (a thread per output element) and embedding_grad, deterministic without
// float atomics: a counting sort of the token positions by id (integer atomics only count), each position
// ranked among the earlier positions of its id, then each table row sums its positions' dy rows in position
// order (the CPU kernel's order).
#include "runtime/cuda/kernels/device_prelude.h"
#include "runtime/cuda/kernels/family_lowerings.h"
#include "runtime/cuda/kernels/kernel_source.h"

namespace tpc::cuda {

Result<NodeLowering> lowerEmbedding(const Node& n, const LoweringContext& ctx) {
  TPC_TRY(checkFloatDType(n, n.operand(0)->dtype(), "table"));
  TPC_TRY(checkIdDType(n, n.operand(1)->dtype(), "ids"));
  int64_t V = n.operand(0)->shape()[0], D = n.operand(0)->shape()[1], rows = n.operand(1)->type().numel();
  KernelSpec k;
  k.entry = "tpc_embedding";
  k.source = devicePrelude() + accessors("w", n.operand(0)->dtype()) + accessors("ids", n.operand(1)->dtype()) +
             accessors("y", n.result(0)->dtype()) + cat(R"(
extern "C" __global__ void tpc_embedding(const w_t* W, const ids_t* I, y_t* Y) {
  const i64 D = )", i64Lit(D), R"(;
  for (i64 e = (i64)blockIdx.x * blockDim.x + threadIdx.x; e < )", i64Lit(rows * D), R"(; e += (i64)gridDim.x * blockDim.x) {
    i64 r = e / D, c = e - r * D;
    i64 row = ids_ld(I, r) - )", i64Lit(n.getInt("vocab_start")), R"(;
    y_st(Y, e, row >= 0 && row < )", i64Lit(V), R"( ? w_ld(W, row * D + c) : 0.f);
  }
}
)");
  k.block.x = 256;
  k.grid.x = gridFor(rows * D, 256);
  k.args = {operandArg(0), operandArg(1), resultArg(0)};
  NodeLowering out;
  out.kernels.push_back(std::move(k));
  return out;
}

// Workspace (zeroed): count[V] i32, start[V] i32, order[N] i32.
//  1. count ids per own table row (integer atomicAdd: the counts do not depend on the order).
//  2. one block: exclusive prefix sum of the counts -> start.
//  3. a thread per position r: rank = own positions before r with the same id (tiles of ids in shared
//     memory), order[start[id] + rank] = r. Quadratic in N, but only compares: cheap for a batch of tokens.
//  4. a block per table row: dtable[v, :] = sum of dy[order[start[v] .. start[v] + count[v]), :] in order.
Result<NodeLowering> lowerEmbeddingGrad(const Node& n, const LoweringContext& ctx) {
  TPC_TRY(checkFloatDType(n, n.operand(0)->dtype(), "dy"));
  TPC_TRY(checkIdDType(n, n.operand(1)->dtype(), "ids"));
  int64_t V = n.getInt("vocab"), D = n.operand(0)->shape().back(), N = n.operand(1)->type().numel();
  if (V >= (int64_t(1) << 31) || N >= (int64_t(1) << 31))
    return makeError("embedding_grad: the CUDA kernel takes fewer than 2^31 rows and ids, got vocab=", V, " and ", N,
                     " ids");
  std::string head = devicePrelude() + accessors("dy", n.operand(0)->dtype()) + accessors("ids", n.operand(1)->dtype()) +
                     accessors("dw", n.result(0)->dtype()) +
                     cat("#define V ", i64Lit(V), "\n#define D ", i64Lit(D), "\n#define N ", i64Lit(N), "\n#define START ",
                         i64Lit(n.getInt("vocab_start")), "\n");
  int64_t countOff = 0, startOff = V * 4, orderOff = 2 * V * 4;
  NodeLowering out;
  out.workspaceBytes = 2 * V * 4 + std::max<int64_t>(N, 1) * 4;
  out.zeroWorkspace = true;
  {
    KernelSpec k;
    k.entry = "tpc_embedding_grad_count";
    k.source = head + R"(
extern "C" __global__ void tpc_embedding_grad_count(const ids_t* I, int* count) {
  for (i64 r = (i64)blockIdx.x * blockDim.x + threadIdx.x; r < N; r += (i64)gridDim.x * blockDim.x) {
    i64 v = ids_ld(I, r) - START;
    if (v >= 0 && v < V) atomicAdd(count + v, 1);
  }
}
)";
    k.block.x = 256;
    k.grid.x = gridFor(N, 256);
    k.args = {operandArg(1), workspaceArg(countOff)};
    out.kernels.push_back(std::move(k));
  }
  {
    KernelSpec k;
    k.entry = "tpc_embedding_grad_scan";
    k.source = head + R"(
// One block of 1024 threads; thread t scans the contiguous slice [t*per, (t+1)*per).
extern "C" __global__ void tpc_embedding_grad_scan(const int* count, int* start) {
  __shared__ int sums[1024];
  const i64 per = (V + 1023) / 1024;
  i64 b = threadIdx.x * per, e = min(b + per, V);
  int s = 0;
  for (i64 v = b; v < e; ++v) s += count[v];
  sums[threadIdx.x] = s;
  __syncthreads();
  for (int o = 1; o < 1024; o <<= 1) {  // inclusive Hillis-Steele scan of the slice sums
    int add = threadIdx.x >= o ? sums[threadIdx.x - o] : 0;
    __syncthreads();
    sums[threadIdx.x] += add;
    __syncthreads();
  }
  int acc = threadIdx.x ? sums[threadIdx.x - 1] : 0;
  for (i64 v = b; v < e; ++v) { start[v] = acc; acc += count[v]; }
}
)";
    k.block.x = 1024;
    k.args = {workspaceArg(countOff), workspaceArg(startOff)};
    out.kernels.push_back(std::move(k));
  }
  {
    KernelSpec k;
    k.entry = "tpc_embedding_grad_order";
    k.source = head + R"(
extern "C" __global__ void tpc_embedding_grad_order(const ids_t* I, const int* start, int* order) {
  __shared__ i64 tile[1024];
  i64 r = (i64)blockIdx.x * blockDim.x + threadIdx.x;
  i64 v = r < N ? ids_ld(I, r) - START : -1;
  int rank = 0;
  i64 last = min((i64)(blockIdx.x + 1) * blockDim.x, N);  // positions this block ranks against: [0, last)
  for (i64 t0 = 0; t0 < last; t0 += blockDim.x) {
    __syncthreads();
    if (t0 + threadIdx.x < N) tile[threadIdx.x] = ids_ld(I, t0 + threadIdx.x) - START;
    __syncthreads();
    i64 n = min((i64)blockDim.x, r - t0);  // earlier positions in this tile
    for (i64 k = 0; k < n; ++k) rank += tile[k] == v;
  }
  if (r < N && v >= 0 && v < V) order[start[v] + rank] = (int)r;
}
)";
    k.block.x = 1024;
    k.grid.x = gridFor(N, 1024, int64_t(1) << 30);
    k.args = {operandArg(1), workspaceArg(startOff), workspaceArg(orderOff)};
    out.kernels.push_back(std::move(k));
  }
  {
    KernelSpec k;
    k.entry = "tpc_embedding_grad_sum";
    k.source = head + R"(
extern "C" __global__ void tpc_embedding_grad_sum(const dy_t* DY, const int* count, const int* start, const int* order,
                                                  dw_t* DW) {
  for (i64 v = blockIdx.x; v < V; v += gridDim.x) {
    int b = start[v], c = count[v];
    for (i64 col = threadIdx.x; col < D; col += blockDim.x) {
      float acc = 0.f;
      for (int k = 0; k < c; ++k) acc += dy_ld(DY, (i64)order[b + k] * D + col);
      dw_st(DW, v * D + col, acc);
    }
  }
}
)";
    k.block.x = rowBlock(D, 256);
    k.grid.x = gridFor(V, 1, 1 << 20);
    k.args = {operandArg(0), workspaceArg(countOff), workspaceArg(startOff), workspaceArg(orderOff), resultArg(0)};
    out.kernels.push_back(std::move(k));
  }
  return out;
}

}  // namespace tpc::cuda
