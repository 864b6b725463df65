// CUDA lowerings of embedding (a thread per output element) and embedding_grad, deterministic without
// float atomics: a counting sort of the token positions by id (integer atomics only count), each position
// ranked among the earlier positions of its id, then each table row sums its positions' dy rows in position
// order (the CPU kernel's order; rows of more than 32 positions: see lowerEmbeddingGradSegments).
#include <algorithm>

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
  std::string head = devicePrelude() + accessors("w", n.operand(0)->dtype()) + accessors("ids", n.operand(1)->dtype()) +
                     accessors("y", n.result(0)->dtype());
  if (D % 8 == 0) {
    // 8 consecutive elements a thread, 16-byte loads and stores (an element a thread: 69 us for gpt2's
    // [16384, 768] bf16 lookup, a quarter of the bandwidth).
    k.source = head + vectorAccessors("w", n.operand(0)->dtype()) + vectorAccessors("y", n.result(0)->dtype()) + cat(R"(
extern "C" __global__ void tpc_embedding(const w_t* W, const ids_t* I, y_t* Y) {
  const i64 D8 = )", i64Lit(D / 8), R"(;
  for (i64 e = (i64)blockIdx.x * blockDim.x + threadIdx.x; e < )", i64Lit(rows * D / 8), R"(; e += (i64)gridDim.x * blockDim.x) {
    const i64 r = e / D8, c = (e - r * D8) * 8;
    const i64 row = ids_ld(I, r) - )", i64Lit(n.getInt("vocab_start")), R"(;
    float v[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
    if (row >= 0 && row < )", i64Lit(V), R"() w_ld8(W, row * )", i64Lit(D), R"( + c, v);
    y_st8(Y, r * )", i64Lit(D), R"( + c, v);
  }
}
)");
    k.block.x = 256;
    k.grid.x = gridFor(rows * D / 8, 256);
    k.args = {operandArg(0), operandArg(1), resultArg(0)};
    NodeLowering out;
    out.kernels.push_back(std::move(k));
    return out;
  }
  k.source = head + cat(R"(
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

namespace {

constexpr int64_t kTile = 32;  // sorted entries per tile; a row with more positions than this is "heavy"

// Steps 1 and 2 of both embedding_grad lowerings: ids counted per table row (integer atomics), then one
// block's exclusive prefix sum of the counts (each id's first slot).
constexpr const char* kCountSource = R"(
extern "C" __global__ void tpc_embedding_grad_count(const ids_t* I, int* count) {
  for (i64 r = (i64)blockIdx.x * blockDim.x + threadIdx.x; r < N; r += (i64)gridDim.x * blockDim.x) {
    i64 v = ids_ld(I, r) - START;
    if (v >= 0 && v < V) atomicAdd(count + v, 1);
  }
}
)";
constexpr const char* kScanSource = R"(
// One block of 1024 threads, in rounds of 8192 counts: a round is loaded coalesced into shared memory (the
// next round's loads in flight meanwhile), each thread sums 8 consecutive counts, a block scan of those sums
// gives each its first slot, and the slots go back out coalesced. (A thread per contiguous slice of V/1024
// counts, uncoalesced, took 86 us at gpt2's V; rounds without the prefetch 20 us.)
extern "C" __global__ void __launch_bounds__(1024) tpc_embedding_grad_scan(const int* count, int* start) {
  __shared__ int tile[8192];
  __shared__ int warps[32];
  __shared__ int carry;  // the counts of the earlier rounds
  const int t = threadIdx.x, lane = t & 31, w = t >> 5;
  if (t == 0) carry = 0;
  int next[8];  // the round's counts, loaded while the round before is scanned
#pragma unroll
  for (int j = 0; j < 8; ++j) next[j] = j * 1024 + t < V ? count[j * 1024 + t] : 0;
  for (i64 r0 = 0; r0 < V; r0 += 8192) {
#pragma unroll
    for (int j = 0; j < 8; ++j) tile[j * 1024 + t] = next[j];
    __syncthreads();
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const i64 v = r0 + 8192 + j * 1024 + t;
      next[j] = v < V ? count[v] : 0;
    }
    int mine[8], s = 0;
#pragma unroll
    for (int j = 0; j < 8; ++j) s += (mine[j] = tile[t * 8 + j]);
    int inc = s;  // inclusive scan of the threads' sums within the warp
    for (int o = 1; o < 32; o <<= 1) {
      const int y = __shfl_sync(0xffffffffu, inc, lane >= o ? lane - o : 0);
      if (lane >= o) inc += y;
    }
    if (lane == 31) warps[w] = inc;
    __syncthreads();
    if (w == 0) {
      int x = warps[lane];
      for (int o = 1; o < 32; o <<= 1) {
        const int y = __shfl_sync(0xffffffffu, x, lane >= o ? lane - o : 0);
        if (lane >= o) x += y;
      }
      warps[lane] = x;
    }
    __syncthreads();
    int slot = carry + (w ? warps[w - 1] : 0) + inc - s;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      tile[t * 8 + j] = slot;
      slot += mine[j];
    }
    __syncthreads();
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const i64 v = r0 + j * 1024 + t;
      if (v < V) start[v] = tile[j * 1024 + t];
    }
    if (t == 0) carry += warps[31];
    __syncthreads();  // the tile, the warp sums and carry are the next round's
  }
}
)";

// The faster embedding_grad (LoweringContext::embeddingGradSegments). Workspace (zeroed): count[V], start[V],
// fill[V], seg[N], order[N] (i32), then the heavy rows' tile partials [NT][2][D] (f32).
//  1. count ids per table row; 2. one block: exclusive prefix sum -> start (as before).
//  3. a thread per position: seg[start[v] + atomicAdd(fill[v], 1)] = r (each id's segment, in any order).
//  4. a thread per segment entry: rank = entries of its segment with a smaller position, order[start + rank]
//     = its position: each segment sorted by position (a warp mostly reads one segment: broadcast loads).
//     Work: the sum of count^2 over ids (the old kernel compared every pair of positions).
//  5. a warp per tile of 32 sorted entries: the runs of heavy rows in it (at most two: the one holding the
//     tile's first entry, slot 0, and one starting later that runs to the tile's end, slot 1) summed in
//     position order into the tile's partial slots.
//  6. a warp per table row, 16-byte loads and stores: no position -> zeros; up to 32 positions -> their dy
//     rows summed in position order from 0 (the old kernel's bits); more -> its tiles' partials in order.
Result<NodeLowering> lowerEmbeddingGradSegments(const Node& n) {
  int64_t V = n.getInt("vocab"), D = n.operand(0)->shape().back(), N = n.operand(1)->type().numel();
  int64_t U = D % 8 == 0 ? 8 : 1;
  int64_t NV = std::max<int64_t>(1, std::min<int64_t>((D + 32 * U - 1) / (32 * U), 4));  // pieces a lane per column chunk
  int64_t NT = std::max<int64_t>(1, (N + kTile - 1) / kTile);
  bool f32 = n.operand(0)->dtype() == DType::f32;
  std::string raw = U == 8 ? cat("struct dy_raw { uint4 q[", f32 ? 2 : 1, "]; };\n") : std::string("struct dy_raw { dy_t q; };\n");
  std::string head =
      devicePrelude() + accessors("dy", n.operand(0)->dtype()) + accessors("ids", n.operand(1)->dtype()) +
      accessors("dw", n.result(0)->dtype()) + vectorAccessors("dy", n.operand(0)->dtype()) +
      vectorAccessors("dw", n.result(0)->dtype()) +
      cat("#define V ", i64Lit(V), "\n#define D ", i64Lit(D), "\n#define N ", i64Lit(N), "\n#define START ",
          i64Lit(n.getInt("vocab_start")), "\n#define U ", U, "\n#define NV ", NV, "\n#define TILE ", kTile,
          "\n#define NT ", i64Lit(NT), "\n#define BATCH ", f32 ? 2 : 4, "\n") +
      raw + R"(
__device__ __forceinline__ void dy_ldr(const dy_t* p, i64 i, dy_raw& r) { r = *reinterpret_cast<const dy_raw*>(p + i); }
__device__ __forceinline__ void dy_cvt(const dy_raw& r, float* v) {
#if U == 8
  dy_ld8(reinterpret_cast<const dy_t*>(&r), 0, v);
#else
  v[0] = dy_ld(reinterpret_cast<const dy_t*>(&r), 0);
#endif
}
// Lane `lane`'s pieces of columns [c0, c0 + 32 U NV): (c0 + (lane + 32 i) U), i < NV.
#define FOR_PIECES(c0) for (int i = 0; i < NV; ++i) if ((c0) + (i64)(lane + 32 * i) * U < D)
#define PIECE(c0) ((c0) + (i64)(lane + 32 * i) * U)
// acc += the dy rows of positions ord[j], j in [jb, je) (jb, je the same in every lane), in order: 32 positions
// read at once, then BATCH rows' loads in flight at a time.
__device__ __forceinline__ void tpc_sum_rows(const dy_t* DY, const int* ord, int jb, int je, i64 c0, int lane,
                                             float (*acc)[U]) {
  for (int j0 = jb; j0 < je; j0 += 32) {
    const int mine = j0 + lane < je ? ord[j0 + lane] : 0;
    const int m = min(32, je - j0);
    for (int j = 0; j < m; j += BATCH) {
      dy_raw r[BATCH][NV];
#pragma unroll
      for (int b = 0; b < BATCH; ++b) {
        const int p = __shfl_sync(0xffffffffu, mine, (j + b) & 31);
        if (j + b < m) {
          const dy_t* row = DY + (i64)p * D;
#pragma unroll
          FOR_PIECES(c0) dy_ldr(row, PIECE(c0), r[b][i]);
        }
      }
#pragma unroll
      for (int b = 0; b < BATCH; ++b)
        if (j + b < m) {
#pragma unroll
          FOR_PIECES(c0) {
            float v[U];
            dy_cvt(r[b][i], v);
#pragma unroll
            for (int k = 0; k < U; ++k) acc[i][k] += v[k];
          }
        }
    }
  }
}
__device__ __forceinline__ void tpc_store_piece(float* p, const float* v) {
#pragma unroll
  for (int k = 0; k < U; ++k) p[k] = v[k];
}
)";
  int64_t countOff = 0, startOff = V * 4, fillOff = 2 * V * 4, segOff = 3 * V * 4,
          orderOff = segOff + std::max<int64_t>(N, 1) * 4;
  int64_t partOff = (orderOff + std::max<int64_t>(N, 1) * 4 + 255) / 256 * 256;
  NodeLowering out;
  out.workspaceBytes = partOff + NT * 2 * D * 4;
  out.zeroWorkspace = true;
  auto add = [&](const char* entry, const std::string& body, uint32_t block, uint32_t grid, std::vector<KernelArg> args) {
    KernelSpec k;
    k.entry = entry;
    k.source = head + body;
    k.block.x = block;
    k.grid.x = grid;
    k.args = std::move(args);
    out.kernels.push_back(std::move(k));
  };
  add("tpc_embedding_grad_count", kCountSource, 256, gridFor(N, 256), {operandArg(1), workspaceArg(countOff)});
  add("tpc_embedding_grad_scan", kScanSource, 1024, 1, {workspaceArg(countOff), workspaceArg(startOff)});
  add("tpc_embedding_grad_fill", R"(
extern "C" __global__ void tpc_embedding_grad_fill(const ids_t* I, const int* start, int* fill, int* seg) {
  for (i64 r = (i64)blockIdx.x * blockDim.x + threadIdx.x; r < N; r += (i64)gridDim.x * blockDim.x) {
    i64 v = ids_ld(I, r) - START;
    if (v >= 0 && v < V) seg[start[v] + atomicAdd(fill + v, 1)] = (int)r;
  }
}
)", 256, gridFor(N, 256), {operandArg(1), workspaceArg(startOff), workspaceArg(fillOff), workspaceArg(segOff)});
  add("tpc_embedding_grad_rank", R"(
extern "C" __global__ void tpc_embedding_grad_rank(const ids_t* I, const int* count, const int* start, const int* seg,
                                                   int* order) {
  const i64 total = (i64)start[V - 1] + count[V - 1];
  for (i64 j = (i64)blockIdx.x * blockDim.x + threadIdx.x; j < total; j += (i64)gridDim.x * blockDim.x) {
    const int p = seg[j];
    const i64 v = ids_ld(I, p) - START;
    const int s = start[v], c = count[v];
    int rank = 0;
#pragma unroll 8
    for (int k = 0; k < c; ++k) rank += seg[s + k] < p;
    order[s + rank] = p;
  }
}
)", 256, gridFor(N, 256), {operandArg(1), workspaceArg(countOff), workspaceArg(startOff), workspaceArg(segOff),
                          workspaceArg(orderOff)});
  add("tpc_embedding_grad_tiles", R"(
extern "C" __global__ void __launch_bounds__(128) tpc_embedding_grad_tiles(const dy_t* DY, const ids_t* I, const int* count,
                                                                         const int* start, const int* order, float* part) {
  const int lane = threadIdx.x & 31;
  const i64 t = (i64)blockIdx.x * 4 + (threadIdx.x >> 5);
  const i64 total = (i64)start[V - 1] + count[V - 1];
  if (t >= NT || t * TILE >= total) return;  // a whole warp: no block barrier below
  const int n = (int)min((i64)TILE, total - t * TILE);
  const int* ord = order + t * TILE;
  const int p = lane < n ? ord[lane] : 0;
  const i64 v = lane < n ? ids_ld(I, p) - START : -1;
  const unsigned heavy = __ballot_sync(0xffffffffu, lane < n && count[v] > TILE);
  const i64 v0 = __shfl_sync(0xffffffffu, v, 0), vl = __shfl_sync(0xffffffffu, v, n - 1);
  // Run 0: entries [0, e0) of id v0; run 1: [s1, n) of id vl when it is another id.
  const unsigned other = __ballot_sync(0xffffffffu, lane < n && v != v0);
  const int e0 = other ? __ffs(other) - 1 : n;
  const int s1 = __ffs(__ballot_sync(0xffffffffu, lane < n && v == vl)) - 1;
  for (int slot = 0; slot < 2; ++slot) {
    const int jb = slot ? s1 : 0, je = slot ? n : (vl == v0 ? n : e0);
    if (!(heavy >> jb & 1u) || (slot && vl == v0)) continue;
    for (i64 c0 = 0; c0 < D; c0 += 32 * U * NV) {
      float acc[NV][U];
#pragma unroll
      for (int i = 0; i < NV; ++i)
#pragma unroll
        for (int k = 0; k < U; ++k) acc[i][k] = 0.f;
      tpc_sum_rows(DY, ord, jb, je, c0, lane, acc);
#pragma unroll
      FOR_PIECES(c0) tpc_store_piece(part + (t * 2 + slot) * D + PIECE(c0), acc[i]);
    }
  }
}
)", 128, static_cast<uint32_t>((NT + 3) / 4),
      {operandArg(0), operandArg(1), workspaceArg(countOff), workspaceArg(startOff), workspaceArg(orderOff),
       workspaceArg(partOff)});
  add("tpc_embedding_grad_rows", R"(
extern "C" __global__ void __launch_bounds__(128) tpc_embedding_grad_rows(const dy_t* DY, const int* count, const int* start,
                                                                        const int* order, const float* part, dw_t* DW) {
  const int lane = threadIdx.x & 31;
  const i64 v = (i64)blockIdx.x * 4 + (threadIdx.x >> 5);
  if (v >= V) return;
  const int c = count[v], s = start[v];
  for (i64 c0 = 0; c0 < D; c0 += 32 * U * NV) {
    float acc[NV][U];
#pragma unroll
    for (int i = 0; i < NV; ++i)
#pragma unroll
      for (int k = 0; k < U; ++k) acc[i][k] = 0.f;
    if (c <= TILE) {
      tpc_sum_rows(DY, order, s, s + c, c0, lane, acc);
    } else {
      // Tiles t0..t1 hold its entries; in t0 it is slot 0 when it starts the tile, else slot 1.
      const i64 t0 = s / TILE, t1 = (s + c - 1) / TILE;
      for (i64 t = t0; t <= t1; ++t) {
        const float* pp = part + (t * 2 + (t == t0 && s % TILE != 0)) * D;
#pragma unroll
        FOR_PIECES(c0) {
#pragma unroll
          for (int k = 0; k < U; ++k) acc[i][k] += pp[PIECE(c0) + k];
        }
      }
    }
#pragma unroll
    FOR_PIECES(c0) {
#if U == 8
      dw_st8(DW + v * D, PIECE(c0), acc[i]);
#else
      dw_st(DW + v * D, PIECE(c0), acc[i][0]);
#endif
    }
  }
}
)", 128, static_cast<uint32_t>((V + 3) / 4),
      {operandArg(0), workspaceArg(countOff), workspaceArg(startOff), workspaceArg(orderOff), workspaceArg(partOff),
       resultArg(0)});
  return out;
}

}  // namespace

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
  if (ctx.embeddingGradSegments) return lowerEmbeddingGradSegments(n);
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
    k.source = head + kCountSource;
    k.block.x = 256;
    k.grid.x = gridFor(N, 256);
    k.args = {operandArg(1), workspaceArg(countOff)};
    out.kernels.push_back(std::move(k));
  }
  {
    KernelSpec k;
    k.entry = "tpc_embedding_grad_scan";
    k.source = head + kScanSource;
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
