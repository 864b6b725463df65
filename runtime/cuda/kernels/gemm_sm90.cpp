// matmul_epilogue on sm_90 as our own GEMM kernel (bf16; f32 accumulation), for six epilogues:
//   gelu_bias (GM_EPI 1): y = gelu(a b + bias), pre = a b + bias
//   dgelu     (GM_EPI 2): g = (a b) * gelu'(pre)    (the MLP's backward through its gelu)
//   dgelu_bgrad (GM_EPI 3): dgelu, and db = g's column sums (the MLP's first bias gradient): each warp's 16 rows
//               summed in its epilogue into a [M / 16, N] f32 workspace, then a second kernel sums those in order
//   bias      (GM_EPI 4): y = a b + bias (the attention's c_attn): the sum rounded once, as cuBLASLt's BIAS
//   bias_residual (GM_EPI 5): y = a b + bias + r (the attention projection and c_proj, onto the residual stream):
//               r [M, N] copied into shared memory ahead of its use as dgelu's pre is
//   bgrad_a   (GM_EPI 6): y = a b, and db = a's column sums (an input gradient d w^T and the bias gradient of d:
//               c_attn's over cuDNN's dQKV, c_fc's over DGELU's output): each warp sums its 16 rows of the a
//               tiles it has in shared memory anyway, for the k-slices kb with kb % (N / 256) == its tile's n
//               index (each k-slice of a row block once), into a [M / 16, K] f32 workspace; a second kernel sums
//               those in order. The reduce_sum that read all of d again (~40-50 us a layer on gpt2-medium) goes.
// gelu_bias and bgrad_a run here by default (CudaOptions::ownGemm; bgrad_a: 1.1 ms less a gpt2-medium step on the
// H100, twenty-fifth session). gelu_bias: 12-14% faster than cuBLASLt's GELU_AUX_BIAS alone on the
// H200 at gpt2's and gpt2-medium's c_fc shapes, and faster inside a training step (docs/performance.md,
// twenty-third session). dgelu and dgelu_bgrad run only when asked for (TPC_OWN_GEMM): cuBLASLt's DGELU runs an
// older, slower kernel family than its plain GEMMs (fourteenth session's ncu), but ours is not yet faster. bias
// and bias_residual too: bias was 6% faster than cuBLASLt's BIAS alone but not measurably so in a step
// (twenty-fourth and twenty-fifth sessions).
//
// The kernel: persistent (a block a SM), warp-specialized. One producer thread streams 128 x 64 tiles of a and
// 64 x 256 tiles of b into a 4-stage shared-memory ring with TMA (128-byte swizzle, mbarriers); two consumer
// warpgroups each multiply 64 rows of the 128 x 256 output tile with wgmma m64n256k16 (f32 accumulators in
// registers). The epilogue stores its results through shared memory with TMA stores. With K >= 512 (GM_MODE 2)
// the epilogue's arithmetic and stores of a tile run during the next tile's mainloop, its 8 chunks spread over
// the k-slices and hidden under their wgmmas, from the tile's sum rounded to bf16: y = gelu(bf16(pre)) and g = bf16(a b) * gelu'(pre), as the
// unfused ops compute them; else (GM_MODE 1) right after the tile's mainloop from the f32 sum, as cuBLASLt's
// epilogues. dgelu copies pre into shared memory with cp.async, chunks ahead of their use.
// With multicast asked for (GM_CLUSTER 2: TPC_OWN_GEMM=...,multicast) the blocks run in clusters of two on tiles
// m and m + 1 of one n: each loads its a tile and half of the shared b tile, which TMA multicasts into both
// blocks' shared memory, so a block reads 32 KB a k-slice from L2 instead of 48 (cuBLASLt's Hopper kernels run in
// clusters too). A stage is refilled once both blocks' consumers have released it.
#include "ir/shape_rules.h"
#include "runtime/cuda/kernels/device_prelude.h"
#include "runtime/cuda/kernels/family_lowerings.h"
#include "runtime/cuda/kernels/kernel_source.h"

namespace tpc::cuda {
namespace {

constexpr int64_t kTileM = 128, kTileN = 256, kTileK = 64;
constexpr uint32_t kSharedBytes = 231424;  // 4 stages of 48 KiB, 32 KiB of store staging, barriers (GM_SMEM_BYTES)

// Device code in three parts, kGemmHead (the checks and the layout), kGemmPtx and kGemmBody; the lowering prepends
// GM_M, GM_N, GM_K, GM_B_KMAJOR, GM_MODE, GM_EPI, GM_SMEM_BYTES, GM_CLUSTER and GM_PRE_AHEAD.
constexpr const char* kGemmHead = R"GEMM(
#if !defined(GM_M) || !defined(GM_N) || !defined(GM_K) || !defined(GM_B_KMAJOR) || !defined(GM_MODE) || !defined(GM_EPI) || !defined(GM_SMEM_BYTES) || !defined(GM_CLUSTER)
#error "define GM_M, GM_N, GM_K, GM_B_KMAJOR, GM_MODE, GM_EPI, GM_SMEM_BYTES, GM_CLUSTER before this source"
#endif
#if GM_CLUSTER != 1 && GM_CLUSTER != 2
#error "GM_CLUSTER must be 1 or 2"
#endif
#if GM_EPI < 1 || GM_EPI > 6
#error "GM_EPI must be 1 (gelu_bias), 2 (dgelu), 3 (dgelu_bgrad), 4 (bias), 5 (bias_residual) or 6 (bgrad_a)"
#endif
// What the epilogue reads besides the sum: a bias row (gelu_bias, bias, bias_residual) and/or an [M, N] tensor,
// called pre below: dgelu's pre, or bias_residual's residual r.
#define GM_HAS_BIAS (GM_EPI == 1 || GM_EPI == 4 || GM_EPI == 5)
#define GM_HAS_PRE (GM_EPI == 2 || GM_EPI == 3 || GM_EPI == 5)
// The epilogue stores the sum (+ bias) as it is: bias, and bgrad_a (whose sums are of a, in the mainloop).
#define GM_PLAIN_OUT (GM_EPI == 4 || GM_EPI == 6)
#if GM_B_KMAJOR != 0 && GM_B_KMAJOR != 1
#error "GM_B_KMAJOR must be 0 or 1"
#endif
#if GM_MODE != 1 && GM_MODE != 2
#error "GM_MODE must be 1 or 2"
#endif
#if !defined(GM_PRE_AHEAD) || (GM_PRE_AHEAD != 1 && GM_PRE_AHEAD != 3)
#error "define GM_PRE_AHEAD as 1 or 3 (dgelu: how many chunks ahead of their use pre's copies are issued)"
#endif

struct alignas(64) TmaDesc { unsigned long long v[16]; };   // bit-identical to CUtensorMap

namespace cfg {
constexpr int BM = 128, BN = 256, BK = 64;      // CTA tile; BK = 64 bf16 = 128 B = one swizzle row
constexpr int STAGES = 4;                       // smem ring depth for A/B
constexpr int A_BYTES = BM * BK * 2;            // 16 KB
constexpr int B_BYTES = BN * BK * 2;            // 32 KB
constexpr int STAGE_BYTES = A_BYTES + B_BYTES;  // 48 KB
// Epilogue staging: per consumer warp a ring of 4 slots of 8 rows x 64 cols bf16 (1 KB each,
// 128B-swizzled so that both the fragment stores and the TMA store are conflict-free).
// gelu_bias uses them in pairs (out, aux) -> double-buffered TMA stores per warp (bias: out in slots 0 and 2, 1
// and 3 idle); dgelu (and bias_residual, r as pre) has out in slot 0 and pre's copies in slots 1-3 (GM_PRE_AHEAD 3), or pairs (out, pre) as
// gelu_bias's (GM_PRE_AHEAD 1).
constexpr int EPI_SLOT = 8 * 64 * 2;
constexpr int EPI_WARP = 4 * EPI_SLOT;
constexpr int EPI_BYTES = 8 * EPI_WARP;         // 8 consumer warps -> 32 KB
constexpr int BAR_BYTES = 1024;
constexpr int SMEM_BYTES = STAGES * STAGE_BYTES + EPI_BYTES + BAR_BYTES + 1024 /*align slack*/;
constexpr int THREADS = 384;                    // WG0 = producer, WG1/WG2 = consumers
// N-major B (GM_B_KMAJOR=0): per stage 4 TMA boxes of 64 (N) x 64 (K) bf16 = 8 KB each, placed
// consecutively; box j holds columns [n0+64j, n0+64j+64), row r (= k) at +128*r, 128B-swizzled.
constexpr int B_BOX_N = 64, B_BOX_BYTES = B_BOX_N * BK * 2;   // 8 KB
constexpr int M = GM_M, N = GM_N, K = GM_K;
constexpr bool DEFER = GM_MODE == 2;
constexpr bool GELU = GM_EPI == 1;              // gelu_bias: y and aux (pre) stored a chunk
// dgelu: its staging slots as one for out and three for pre, whose copies are issued 3 chunks (k-slices, with
// DEFER) ahead of their use (GM_PRE_AHEAD 3), or as gelu_bias's two pairs, out and pre, copied 1 chunk ahead (1).
// A chunk's copy waits out an L2 round trip under the mainloop's TMA traffic; one k-slice of wgmmas may not cover it.
constexpr int PRE_AHEAD = GM_HAS_PRE ? GM_PRE_AHEAD : 1;
static_assert(PRE_AHEAD == 1 || PRE_AHEAD == 3, "pre_slot and await_pre know the schemes 1 and 3 only");
// GM_CLUSTER 2: blocks in pairs (a cluster) on tiles m and m + 1 of the same n: each loads its own a and half of
// the shared b tile, multicast into both blocks' shared memory (32 KB a k-slice from L2 a block instead of 48).
constexpr int CLUSTER = GM_CLUSTER;
static_assert(CLUSTER == 1 || (M / BM) % CLUSTER == 0, "GM_CLUSTER 2 needs an even number of 128-row tiles");
static_assert(M % BM == 0 && N % BN == 0 && K % BK == 0, "shape must be a multiple of 128 x 256 x 64");
static_assert(!DEFER || K >= 8 * BK, "GM_MODE 2 needs K >= 512");
static_assert(SMEM_BYTES <= 232448, "exceeds sm_90 max dynamic smem");
}
)GEMM";

// Every PTX instruction the kernel uses, behind a named function (tests/unit/sm90_emulator.h replaces this part to
// run the kernel on the CPU).
constexpr const char* kGemmPtx = R"GEMM(
// The kernel's dynamic shared memory, 1 KB aligned for the 128-byte swizzle.
#define GM_DYNAMIC_SMEM(name) extern __shared__ __attribute__((aligned(1024))) unsigned char name[]
#if GM_CLUSTER == 2
#define GM_CLUSTER_DIMS __cluster_dims__(2, 1, 1)
#else
#define GM_CLUSTER_DIMS
#endif
__device__ __forceinline__ unsigned smem_addr(const void* p) {
  unsigned r;
  asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(r) : "l"(p));
  return r;
}
__device__ __forceinline__ void mbar_init(unsigned bar, unsigned count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" :: "r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_expect_tx(unsigned bar, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" :: "r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_arrive(unsigned bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" :: "r"(bar) : "memory");
}
// Arrive on the barrier at the same offset in block `cta` of the cluster (this one's included), releasing this
// block's reads of the stage to the producer that will overwrite it there.
__device__ __forceinline__ void mbar_arrive_cluster(unsigned bar, unsigned cta) {
  asm volatile("{ .reg .b32 ra; mapa.shared::cluster.u32 ra, %0, %1; mbarrier.arrive.release.cluster.shared::cluster.b64 _, [ra]; }"
               :: "r"(bar), "r"(cta) : "memory");
}
__device__ __forceinline__ unsigned cluster_reg_rank() { unsigned r; asm("mov.u32 %0, %%cluster_ctarank;" : "=r"(r)); return r; }
__device__ __forceinline__ unsigned cluster_reg_id() { unsigned r; asm("mov.u32 %0, %%clusterid.x;" : "=r"(r)); return r; }
__device__ __forceinline__ unsigned cluster_reg_count() { unsigned r; asm("mov.u32 %0, %%nclusterid.x;" : "=r"(r)); return r; }
// Every thread of both blocks: the barriers' initialisation is seen cluster-wide before any remote use.
__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;" ::: "memory");
}
// Wait until the phase with the given parity has completed. Bounded: a pipeline that never completes a
// phase (a bug, not a slow GPU: a legitimate wait lasts microseconds) ends the kernel after ~4M polls with a
// sticky launch error (the process must exit) instead of hanging the GPU. The bound counts polls, not time:
// under compute-sanitizer or a debugger it may fire on a healthy kernel. The producer traps. The consumers
// store to address 0 instead (an illegal-address error): a trap in their code makes ptxas drop the setmaxnreg
// split and compile the whole kernel at the entry's 168 registers, where the deferred epilogue spilled 184-328
// bytes a thread (ptxas -v, CUDA 13.0; nineteenth session).
// With GM_CLUSTER 2 the producer's waits (on its empty barriers, which both blocks' consumers arrive on) acquire
// at cluster scope.
#if GM_CLUSTER == 2
#define GM_PRODUCER_WAIT "mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64"
#else
#define GM_PRODUCER_WAIT "mbarrier.try_wait.parity.shared::cta.b64"
#endif
template <bool PRODUCER>
__device__ __forceinline__ void mbar_wait(unsigned bar, unsigned parity) {
  unsigned done;
  for (unsigned it = 1;; ++it) {
    if (PRODUCER)
      asm volatile("{ .reg .pred p; " GM_PRODUCER_WAIT " p, [%1], %2; selp.u32 %0, 1, 0, p; }"
                   : "=r"(done) : "r"(bar), "r"(parity) : "memory");
    else
      asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
                   : "=r"(done) : "r"(bar), "r"(parity) : "memory");
    if (done) return;
    if (it > (1u << 22)) {
      if (PRODUCER) asm volatile("trap;");
      else asm volatile("{ .reg .u64 z; mov.u64 z, 0; st.volatile.global.u32 [z], 0; }" ::: "memory");
    }
  }
}
__device__ __forceinline__ void tma_load_2d(unsigned dst, const TmaDesc* map, unsigned bar, int c0, int c1) {
  asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4}], [%2];"
               :: "r"(dst), "l"(map), "r"(bar), "r"(c0), "r"(c1) : "memory");
}
// The same box into this block's and the cluster's other block's shared memory (the same offsets), completing
// bytes on the barrier at the same offset in each: ctaMask 0b11.
__device__ __forceinline__ void tma_load_2d_multicast(unsigned dst, const TmaDesc* map, unsigned bar, int c0, int c1) {
  asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster [%0], [%1, {%4, %5}], [%2], %3;"
               :: "r"(dst), "l"(map), "r"(bar), "h"((unsigned short)3), "r"(c0), "r"(c1) : "memory");
}
__device__ __forceinline__ void tma_store_2d(const TmaDesc* map, unsigned src, int c0, int c1) {
  asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%2, %3}], [%1];"
               :: "l"(map), "r"(src), "r"(c0), "r"(c1) : "memory");
}
__device__ __forceinline__ void bulk_commit() { asm volatile("cp.async.bulk.commit_group;" ::: "memory"); }
template <int N> __device__ __forceinline__ void bulk_wait_read() {   // smem of older groups may be reused
  asm volatile("cp.async.bulk.wait_group.read %0;" :: "n"(N) : "memory");
}
__device__ __forceinline__ void bulk_wait_all() { asm volatile("cp.async.bulk.wait_group 0;" ::: "memory"); }
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
template <int N> __device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;" :: "n"(N) : "memory");
}
// Make the accumulator registers "used/defined" around wgmma so the compiler keeps them in place.
__device__ __forceinline__ void acc_fence(float (&d)[128]) {
#pragma unroll
  for (int i = 0; i < 128; ++i) asm volatile("" : "+f"(d[i]) :: "memory");
}

#if GM_B_KMAJOR
#define GM_TRANS_B "0"
#else
#define GM_TRANS_B "1"   // B is N-major in smem
#endif
// Generated: one wgmma.mma_async m64n256k16, f32 += bf16 * bf16, A (K-major) and B from shared memory.
// scale_d == 0 -> D = A*B (ignores old accumulator), else D += A*B.
__device__ __forceinline__ void wgmma_m64n256k16(float (&d)[128], unsigned long long da, unsigned long long db, int scale_d) {
  asm volatile(
    "{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
    "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}, %128, %129, p, 1, 1, 0, " GM_TRANS_B ";\n}\n"
    : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
      "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
      "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
      "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
      "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
      "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
      "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
      "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]),
      "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]),
      "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]),
      "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]),
      "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]),
      "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]),
      "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]),
      "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]),
      "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
    : "l"(da), "l"(db), "r"(scale_d));
}

__device__ __forceinline__ unsigned pack_bf16(float lo, float hi) {   // round-to-nearest-even
  unsigned r;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}
// Registers: the producer warpgroup gives some up, the consumers take them (setmaxnreg).
template <int N> __device__ __forceinline__ void regs_dealloc() { asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" :: "n"(N)); }
template <int N> __device__ __forceinline__ void regs_alloc() { asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" :: "n"(N)); }
// The barriers' initialisation, visible to the async proxy and the cluster.
__device__ __forceinline__ void fence_mbar_init() { asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory"); }
__device__ __forceinline__ void prefetch_tmap(const TmaDesc* map) { asm volatile("prefetch.tensormap [%0];" :: "l"(map) : "memory"); }
__device__ __forceinline__ void prefetch_l2(const void* p) { asm volatile("prefetch.global.L2 [%0];" :: "l"(p)); }
__device__ __forceinline__ void sts32(unsigned addr, unsigned v) { asm volatile("st.shared.b32 [%0], %1;" :: "r"(addr), "r"(v) : "memory"); }
__device__ __forceinline__ unsigned lds32(unsigned addr) {
  unsigned v;
  asm volatile("ld.shared.b32 %0, [%1];" : "=r"(v) : "r"(addr) : "memory");
  return v;
}
__device__ __forceinline__ void lds128(unsigned addr, unsigned& a, unsigned& b, unsigned& c, unsigned& d) {
  asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];" : "=r"(a), "=r"(b), "=r"(c), "=r"(d) : "r"(addr) : "memory");
}
__device__ __forceinline__ void stg_f32x2(float* p, float a, float b) {
  asm volatile("st.global.v2.f32 [%0], {%1, %2};" :: "l"(p), "f"(a), "f"(b) : "memory");
}
__device__ __forceinline__ void stg_f32x4(float* p, float a, float b, float c, float d) {
  asm volatile("st.global.v4.f32 [%0], {%1, %2, %3, %4};" :: "l"(p), "f"(a), "f"(b), "f"(c), "f"(d) : "memory");
}
// cp.async: 16 bytes global -> shared by this thread, its groups, and waiting until at most N newer groups are pending.
__device__ __forceinline__ void cp_async16(unsigned dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" :: "r"(dst), "l"(src) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N> __device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;" :: "n"(N) : "memory"); }
// The MUFU's 2^x and 1/x (~2 ulp; subnormals flushed).
__device__ __forceinline__ float ex2_approx(float x) { float r; asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x)); return r; }
__device__ __forceinline__ float rcp_approx(float x) { float r; asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x)); return r; }
)GEMM";

// The kernel itself: plain CUDA C++ over kGemmPtx's functions.
constexpr const char* kGemmBody = R"GEMM(
// wgmma shared-memory matrix descriptor (PTX ISA "matrix descriptor"): [0,14) start>>4,
// [16,30) LBO>>4, [32,46) SBO>>4, [49,52) base offset (0: tiles are 1024-B aligned),
// [62,64) layout = 1 (SWIZZLE_128B).
//
// K-major operand, 128B swizzle (A always; B when GM_B_KMAJOR=1): rows of 64 K-elements = 128 B,
//   SBO = 1024 B (stride between 8-row core-matrix groups along M/N), LBO unused (=1).
//   Advancing 16 elements along K inside the 128-B swizzle row = +32 B = +2 in the start field
//   (hardware applies the XOR swizzle on the final address bits, same as TMA wrote them).
__device__ __forceinline__ unsigned long long make_desc(unsigned saddr) {
  return (unsigned long long)((saddr & 0x3FFFF) >> 4) | (1ull << 16) | (64ull << 32) | (1ull << 62);
}
// MN-major operand, 128B swizzle (B when GM_B_KMAJOR=0; used with imm-trans-b = 1). CUTLASS
// canonical form (cute make_gmma_desc<Major::MN>, in 16-B units, T = 8 bf16):
//   Swizzle<3,4,3> o ((T,8,m),(8,k)) : ((1,T,LBO),(8T,SBO))
// i.e. atoms of 64 N-elements (128 B) x 8 K-rows (1024 B); LBO = byte stride between atoms along
// N (= one 8 KB TMA box here), SBO = byte stride between 8-row groups along K (1024 B).
// Advancing K by 16 = two 8-row groups = +2048 B = +128 in the start field.
__device__ __forceinline__ unsigned long long make_desc_mn(unsigned saddr) {
  return (unsigned long long)((saddr & 0x3FFFF) >> 4) | ((unsigned long long)(cfg::B_BOX_BYTES >> 4) << 16) |
         (64ull << 32) | (1ull << 62);
}

__device__ __forceinline__ float bf16lo(unsigned v) { return __uint_as_float(v << 16); }
__device__ __forceinline__ float bf16hi(unsigned v) { return __uint_as_float(v & 0xFFFF0000u); }
// gelu(h) = 0.5 h (1 + tanh(u)), u = sqrt(2/pi) (h + 0.044715 h^3), as h / (1 + exp(-2u)): the same function
// without 1 + tanh(u)'s cancellation for negative h (where an approximate tanh loses the result's digits), in
// two MUFU ops (ex2, rcp: ~1e-6 relative). exp(-2u) = 2^x with x = h (k0 + k1 h^2), the constants scaled by
// -2 log2(e) (one multiply fewer). The epilogue's arithmetic runs between the wgmmas' issue and their wait, so
// every instruction here counts: an IEEE division made it outlast the wgmmas it hides under (gpt2-medium's step
// 79 -> 82 ms). __fdividef(h, inf) is -0, gelu's limit.
constexpr float kGeluC = 0.7978845608f, kGeluA = 0.044715f, kTwoLog2e = 2.8853900818f;   // c = sqrt(2/pi), a
constexpr float kGeluX0 = -kTwoLog2e * kGeluC, kGeluX1 = kGeluX0 * kGeluA;
__device__ __forceinline__ float gelu_tanh(float h) {
  const float x = h * __fmaf_rn(kGeluX1, h * h, kGeluX0);
  return __fdividef(h, 1.0f + ex2_approx(x));
}
// gelu'(v) = (1 + t) / 2 + v (1 - t^2) c (1 + 3 a v^2) / 2 with t = tanh(u), u = c (v + a v^3): with
// s = (1 + t) / 2 = 1 / (1 + e), e = exp(-2u), 1 - t^2 = 4 e s^2, so gelu'(v) = s (1 + p (e s)) with
// p = 2 c v (1 + 3 a v^2), in the same two MUFU ops and without a cancelling 1 - t or 1 - t^2. -2u (as x, in
// log2 units) is clamped at 80 log2(e) so that e stays finite (e s = 1 there, s ~ 2e-35), and below v = -12
// (u < -71) the result is gelu''s limit, 0: p would otherwise outgrow s (-inf from v ~ -2e13). A NaN v stays NaN.
// 11 float operations and 2 MUFU: with fewer, dgelu's epilogue hides under its wgmmas (twenty-third session).
__device__ __forceinline__ float gelu_tanh_grad(float v) {
  const float v2 = v * v;
  const float x = fminf(v * __fmaf_rn(kGeluX1, v2, kGeluX0), 40.0f * kTwoLog2e);
  const float e = ex2_approx(x);
  const float sg = rcp_approx(1.0f + e);
  const float p = v * __fmaf_rn(2.0f * kGeluC * 3.0f * kGeluA, v2, 2.0f * kGeluC);
  return v < -12.0f ? 0.0f : sg * __fmaf_rn(p, e * sg, 1.0f);
}

// One halving step of a reduce-scatter over the lanes that differ in MASK: of the C values v[0, C), a lane keeps
// the half its MASK bit picks (upper: [C/2, C)) and adds its partner's values of that half, which go to v[0, C/2).
// Each sum is formed once, by one lane, in a fixed order.
template <int C, int MASK>
__device__ __forceinline__ void reduce_scatter_step(float* v, unsigned lane) {
  const bool upper = (lane & MASK) != 0;
#pragma unroll
  for (int i = 0; i < C / 2; ++i) {
    const float lo = v[i], hi = v[i + C / 2];
    const float recv = __shfl_xor_sync(0xffffffffu, upper ? lo : hi, MASK);
    v[i] = (upper ? hi : lo) + recv;
  }
}

// Persistent: block (or, GM_CLUSTER 2, cluster) b takes units b, b + the grid's count, ... A unit is a tile, or a
// pair of tiles m, m + 1 of the same n (the cluster's blocks by rank). Unit order: n fastest (m = u / num_n,
// n = u % num_n): W (<= 8 MB) stays in L2, and the ~132 tiles in flight cover ~11 row blocks of X, read from DRAM
// about once.
template <int V> struct Int { static constexpr int value = V; };
__device__ __forceinline__ void unit_origin(int unit, unsigned rank, int& m0, int& n0) {
  constexpr int num_n = cfg::N / cfg::BN;
  m0 = ((unit / num_n) * cfg::CLUSTER + (int)rank) * cfg::BM;
  n0 = (unit % num_n) * cfg::BN;
}

// DEFER=false: exact epilogue from the f32 sum h (+ bias), right after the tile's mainloop: out = bf16(gelu(h))
//              (gelu_bias), bf16(h * gelu'(pre)) (dgelu), bf16(h + r) (bias_residual, rounded once as cuBLASLt's).
// DEFER=true : only bf16(h) is formed after the mainloop (cheap; gelu_bias's aux); the epilogue's arithmetic,
//              smem and TMA stores of that tile are spread over the K slices of the NEXT tile (chunk c in
//              slice c KB / 8), hidden under its wgmmas: out = bf16(gelu(bf16(h))), bf16(bf16(h) * gelu'(pre)) or
//              bf16(bf16(h) + r), closer to what the unfused ops in bf16 compute (they round after each op);
//              within ~1 bf16 ulp of the exact forms.
// Launch (gemm_sm90.cpp): block 384 (warpgroup 0 the TMA producer, 1-2 the consumers), grid min(#SMs, tiles)
// (GM_CLUSTER 2: even, in clusters of two by the kernel's attribute), GM_SMEM_BYTES of dynamic shared memory.
// Parameters: the TMA descriptors of X, W, out and (gelu_bias) aux (128B swizzle; boxes: X {64 k, 128 rows}, W
// {64 n, 64 k} or, K-major, {64 k, 256 / GM_CLUSTER n}, out and aux {64, 8}), then the bias (gelu_bias, bias,
// bias_residual) and/or pre (dgelu's pre, bias_residual's residual: [M, N] row-major).
static_assert(GM_SMEM_BYTES == cfg::SMEM_BYTES, "the launch's shared memory (kSharedBytes) must be the layout's");

#if GM_EPI == 1
extern "C" __global__ void GM_CLUSTER_DIMS __launch_bounds__(384, 1)
gemm_gelu_kernel(const __grid_constant__ TmaDesc tmA, const __grid_constant__ TmaDesc tmB,
                 const __grid_constant__ TmaDesc tmOut, const __grid_constant__ TmaDesc tmAux,
                 const unsigned short* __restrict__ bias) {
#elif GM_EPI == 2
extern "C" __global__ void GM_CLUSTER_DIMS __launch_bounds__(384, 1)
gemm_dgelu_kernel(const __grid_constant__ TmaDesc tmA, const __grid_constant__ TmaDesc tmB,
                  const __grid_constant__ TmaDesc tmOut, const unsigned short* __restrict__ pre) {
#elif GM_EPI == 4
extern "C" __global__ void GM_CLUSTER_DIMS __launch_bounds__(384, 1)
gemm_bias_kernel(const __grid_constant__ TmaDesc tmA, const __grid_constant__ TmaDesc tmB,
                 const __grid_constant__ TmaDesc tmOut, const unsigned short* __restrict__ bias) {
#elif GM_EPI == 5
extern "C" __global__ void GM_CLUSTER_DIMS __launch_bounds__(384, 1)
gemm_bias_residual_kernel(const __grid_constant__ TmaDesc tmA, const __grid_constant__ TmaDesc tmB,
                          const __grid_constant__ TmaDesc tmOut, const unsigned short* __restrict__ bias,
                          const unsigned short* __restrict__ pre) {   // pre: the residual r, [M, N]
#elif GM_EPI == 6
extern "C" __global__ void GM_CLUSTER_DIMS __launch_bounds__(384, 1)
gemm_bgrad_a_kernel(const __grid_constant__ TmaDesc tmA, const __grid_constant__ TmaDesc tmB,
                    const __grid_constant__ TmaDesc tmOut, float* __restrict__ colsums) {
#else
extern "C" __global__ void GM_CLUSTER_DIMS __launch_bounds__(384, 1)
gemm_dgelu_bgrad_kernel(const __grid_constant__ TmaDesc tmA, const __grid_constant__ TmaDesc tmB,
                        const __grid_constant__ TmaDesc tmOut, const unsigned short* __restrict__ pre,
                        float* __restrict__ colsums) {
#endif
  using namespace cfg;
  GM_DYNAMIC_SMEM(smem_raw);
  const unsigned base = (smem_addr(smem_raw) + 1023u) & ~1023u;   // swizzled tiles need 1 KB alignment
  const unsigned epi = base + STAGES * STAGE_BYTES;
  const unsigned bars = epi + EPI_BYTES;                           // full[s] then empty[s], 8 B each
  auto full_bar = [&](int s) { return bars + 8u * s; };
  auto empty_bar = [&](int s) { return bars + 8u * (STAGES + s); };

  constexpr int num_units = (M / BM) * (N / BN) / CLUSTER, KB = K / BK;
  const unsigned rank = CLUSTER == 2 ? cluster_reg_rank() : 0u;
  const int first_unit = CLUSTER == 2 ? (int)cluster_reg_id() : (int)blockIdx.x;
  const int unit_step = CLUSTER == 2 ? (int)cluster_reg_count() : (int)gridDim.x;

  if (threadIdx.x == 0) {
    for (int s = 0; s < STAGES; ++s) {
      mbar_init(full_bar(s), 1);              // producer's arrive.expect_tx + TMA tx bytes (both blocks' b halves)
      mbar_init(empty_bar(s), 8 * CLUSTER);   // lane 0 of each of the 8 consumer warps (of each block)
    }
    fence_mbar_init();
    fence_proxy_async();
  }
  if constexpr (CLUSTER == 2) cluster_sync();
  else __syncthreads();

  const int wg = threadIdx.x / 128;
  if (wg == 0) {
    // ------------------------------- producer ---------------------------------
    regs_dealloc<40>();
    if (threadIdx.x == 0) {
      prefetch_tmap(&tmA);
      prefetch_tmap(&tmB);
      int s = 0; unsigned ph = 0;
      for (int unit = first_unit; unit < num_units; unit += unit_step) {
        int m0, n0;
        unit_origin(unit, rank, m0, n0);
#pragma unroll 1
        for (int kb = 0; kb < KB; ++kb) {
          // First pass: parity 1 = "previous phase" -> passes. GM_CLUSTER 2: both blocks' consumers are done with
          // stage s (this block's b half goes into the other's too).
          mbar_wait<true>(empty_bar(s), ph ^ 1);
          const unsigned sa = base + s * STAGE_BYTES;
          mbar_expect_tx(full_bar(s), STAGE_BYTES);
          tma_load_2d(sa, &tmA, full_bar(s), kb * BK, m0);
#if GM_CLUSTER == 2
#if GM_B_KMAJOR
          // b^T's n-rows [n0 + 128 rank, +128): the second half of the 256-row tile starts 16 KB in.
          tma_load_2d_multicast(sa + A_BYTES + rank * (B_BYTES / 2), &tmB, full_bar(s), kb * BK, n0 + (int)rank * (BN / 2));
#else
#pragma unroll
          for (int j = 0; j < BN / B_BOX_N / 2; ++j) {
            const int box = (int)rank * (BN / B_BOX_N / 2) + j;
            tma_load_2d_multicast(sa + A_BYTES + box * B_BOX_BYTES, &tmB, full_bar(s), n0 + box * B_BOX_N, kb * BK);
          }
#endif
#else
#if GM_B_KMAJOR
          tma_load_2d(sa + A_BYTES, &tmB, full_bar(s), kb * BK, n0);
#else
#pragma unroll
          for (int j = 0; j < BN / B_BOX_N; ++j)
            tma_load_2d(sa + A_BYTES + j * B_BOX_BYTES, &tmB, full_bar(s), n0 + j * B_BOX_N, kb * BK);
#endif
#endif
          if (++s == STAGES) { s = 0; ph ^= 1; }
        }
      }
      if constexpr (CLUSTER == 2) {
        // Stay until both blocks' consumers have released every stage: the other block's arrivals on this block's
        // barriers (and its reads of what this block multicast) must land before this block's shared memory goes.
        for (int i = 0; i < STAGES; ++i) {
          mbar_wait<true>(empty_bar(s), ph ^ 1);
          if (++s == STAGES) { s = 0; ph ^= 1; }
        }
      }
    }
  } else {
    // ------------------------------- consumers --------------------------------
    regs_alloc<232>();
    const int cw = wg - 1;                       // consumer WG: rows [64*cw, 64*cw+64) of the tile
    const int warp = (threadIdx.x / 32) & 3, lane = threadIdx.x & 31;
    const int r8 = lane >> 2;                    // fragment row within an 8-row group
    const unsigned epi_w = epi + (cw * 4 + warp) * EPI_WARP;
#if GM_HAS_BIAS
    const unsigned* bias32 = reinterpret_cast<const unsigned*>(bias);
#endif
    float acc[128];
    unsigned hp[64];            // DEFER: previous tile's sum as packed bf16x2, hp[(cg*8+j)*2+half] (unset
                                // until the first tile's epilogue: nothing is pending before it)
    int s = 0; unsigned ph = 0, prev_s = 0;
    int pend_row0 = -1, pend_n0 = 0;   // DEFER: where the pending (previous) tile goes
    const unsigned off_base = r8 * 128 + (lane & 3) * 4;
    // Hand stage s back to the producer(s) that fill it: this block's, and with GM_CLUSTER 2 the other block's too
    // (each multicasts its half of b into both).
    auto release = [&](unsigned st) {
      if constexpr (CLUSTER == 2) {
        mbar_arrive_cluster(empty_bar(st), 0);
        mbar_arrive_cluster(empty_bar(st), 1);
      } else {
        mbar_arrive(empty_bar(st));
      }
    };

#if GM_EPI == 6
    // bgrad_a: the running tile's n index and this warp's first row; the warp's 16 rows of stage st's a tile (k-slice
    // kb) summed over rows into colsums[row / 16][64 kb + c]. A lane reads one 16-byte piece (8 columns) of 4 rows
    // (row lane / 8 + 4i, piece lane % 8 at its 128B swizzle: piece ^ row % 8); lanes 8 apart hold the same columns
    // and add theirs in a fixed order; lanes 0-7 store the 16-row sums. While the k-slice's wgmmas run.
    int sum_nt = 0, sum_row0 = 0;
    auto sum_a = [&](int kb, unsigned st) {
      const unsigned sa = base + st * STAGE_BYTES + (cw * 64 + warp * 16) * 128;
      const unsigned piece = lane & 7;
      float t[8];
#pragma unroll
      for (int e = 0; e < 8; ++e) t[e] = 0.0f;
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const unsigned r = (lane >> 3) + 4 * i;
        unsigned v[4];
        lds128(sa + r * 128 + ((piece ^ (r & 7)) << 4), v[0], v[1], v[2], v[3]);
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          t[2 * e] += bf16lo(v[e]);
          t[2 * e + 1] += bf16hi(v[e]);
        }
      }
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        t[e] += __shfl_xor_sync(0xffffffffu, t[e], 8);
        t[e] += __shfl_xor_sync(0xffffffffu, t[e], 16);
      }
      if (lane < 8) {
        float* dst = colsums + (size_t)(sum_row0 / 16) * K + kb * BK + 8 * piece;
        stg_f32x4(dst, t[0], t[1], t[2], t[3]);
        stg_f32x4(dst + 4, t[4], t[5], t[6], t[7]);
      }
    };
#endif
    // One 64-wide K slice: 4 x m64n256k16, then `between()` runs while the wgmmas execute
    // (they are async), then wait until slice kb-1 is done and hand its smem stage back.
    auto kstep = [&](int kb, auto between) {
      mbar_wait<false>(full_bar(s), ph);
      const unsigned sa = base + s * STAGE_BYTES + cw * (64 * 128);   // this WG's 64 rows of A
      const unsigned sb = base + s * STAGE_BYTES + A_BYTES;
#if GM_B_KMAJOR
      const unsigned long long da = make_desc(sa), db = make_desc(sb);
      constexpr unsigned long long DB_K16 = 2;     // +32 B per 16 K-elements (within the 128-B row)
#else
      const unsigned long long da = make_desc(sa), db = make_desc_mn(sb);
      constexpr unsigned long long DB_K16 = 128;   // +2048 B per 16 K-rows (two 1-KB 8-row groups)
#endif
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) wgmma_m64n256k16(acc, da + 2 * kk, db + DB_K16 * kk, (kb | kk) != 0);
      wgmma_commit();
      between();
#if GM_EPI == 6
      if (kb % (N / BN) == sum_nt) sum_a(kb, (unsigned)s);
#endif
      wgmma_wait<1>();
      if (kb > 0 && lane == 0) release(prev_s);
      prev_s = s;
      if (++s == STAGES) { s = 0; ph ^= 1; }
    };
    // Chunk c (0-7) of a warp's 16 x 256 part of a tile: rows + 8 (c % 2), columns + 64 (c / 2). Its staging slots:
    // gelu_bias (and bias, and dgelu with PRE_AHEAD 1) alternate between two pairs, out then aux or pre (bias: out
    // only); dgelu with PRE_AHEAD 3 has out in slot 0 and pre in slots 1-3 in turn.
    auto out_slot = [&](int c) { return epi_w + (PRE_AHEAD == 1 ? (c % 2) * 2 : 0) * EPI_SLOT; };
    // Write chunk c of out (and, gelu_bias, of aux) into this warp's staging slots and TMA-store it. wait_group.read
    // = the last store from the out slot (two chunks ago with two pairs, the previous one with one slot) has
    // finished reading smem.
    auto store_chunk = [&](int c, int gcol, int grow, auto value) {
      const unsigned so = out_slot(c), sx = so + EPI_SLOT;
      if (lane == 0) {
        if constexpr (PRE_AHEAD == 1) bulk_wait_read<1>();
        else bulk_wait_read<0>();
      }
      __syncwarp();
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        unsigned vaux = 0, vout;
        value(j, vaux, vout);
        // 128B swizzle: 16-byte chunk index j XOR (row % 8) -> conflict-free across the warp.
        const unsigned off = off_base + ((j ^ r8) << 4);
        if constexpr (GELU) sts32(sx + off, vaux);
        sts32(so + off, vout);
      }
      fence_proxy_async();                                 // generic-proxy writes -> visible to TMA
      __syncwarp();
      if (lane == 0) {
        tma_store_2d(&tmOut, so, gcol, grow);
#if GM_EPI == 1
        tma_store_2d(&tmAux, sx, gcol, grow);
#endif
        bulk_commit();
      }
    };
#if GM_HAS_PRE
    auto pre_slot = [&](int c) { return epi_w + (PRE_AHEAD == 1 ? (c % 2) * 2 + 1 : 1 + c % 3) * EPI_SLOT; };
    // pre of chunk c of the warp's part at (row0, col0), copied by the warp with cp.async into the chunk's pre slot,
    // 128B-swizzled as the staging slots: each lane then reads its fragment columns where gelu_bias writes aux
    // (conflict-free). No registers hold it in flight; await_pre waits for the copy.
    auto load_pre = [&](int c, int row0, int col0) {
      const unsigned sx = pre_slot(c);
      const int grow = row0 + (c % 2) * 8, gcol = col0 + (c / 2) * 64;
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const int r = lane >> 2, q = (lane & 3) * 2 + i;  // row r, 16-byte piece q (8 columns) of the chunk
        const unsigned short* src = pre + (size_t)(grow + r) * N + gcol + 8 * q;
        cp_async16(sx + r * 128 + ((q ^ r) << 4), src);
      }
      cp_async_commit();
    };
    // Wait for this lane's copies of chunk c, then for the warp's (every lane reads pieces other lanes copied).
    // cp.async.wait_group N waits until at most the N newest groups are pending: N is the number of copies issued
    // after chunk c's by the time chunk c is used (more would be a read before the data lands; fewer, a wait for
    // copies not needed yet). Without DEFER (and with PRE_AHEAD 1) copies go in chunk order, chunk c + PRE_AHEAD
    // once chunk c is used. With DEFER and PRE_AHEAD 3 the next tile's first chunks are issued during this tile's
    // last ones, in the order 2 (after chunk 5), 0 (after 6), 1 (after 7), each into the slot just freed; so before
    // chunk 0's use only chunk 1's follows it, before chunk 1's chunk 3's, before chunk 2's 0, 1, 3 and 4; then
    // two, except in the last tile's epilogue (`drain`), where nothing comes after chunk 7.
    auto await_pre = [&](int c, bool drain) {
      const int newer = DEFER && PRE_AHEAD == 3 ? (c < 2 ? 1 : c == 2 ? 4 : drain && 7 - c < 2 ? 7 - c : 2)
                                                : (PRE_AHEAD - 1 < 7 - c ? PRE_AHEAD - 1 : 7 - c);
      if (newer >= 4) cp_async_wait<4>();
      else if (newer >= 2) cp_async_wait<2>();
      else if (newer == 1) cp_async_wait<1>();
      else cp_async_wait<0>();
      __syncwarp();
    };
    // The copies of chunks [0, PRE_AHEAD) where no epilogue is pending (their slots are free): in chunk order, or in
    // the order of the copies made during a deferred epilogue (await_pre).
    auto load_first_pre = [&](int row0, int col0) {
      if constexpr (DEFER && PRE_AHEAD == 3) {
        load_pre(2, row0, col0);
        load_pre(0, row0, col0);
        load_pre(1, row0, col0);
      } else {
#pragma unroll
        for (int c = 0; c < PRE_AHEAD; ++c) load_pre(c, row0, col0);
      }
    };
    // The warp's 16 rows x 256 columns of pre into L2 at the start of a tile's mainloop (64 lines of 128 B, two a
    // lane), so that the chunk copies, issued ahead of their use, find it there.
    auto prefetch_pre_l2 = [&](int grow, int gcol) {
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const int line = lane * 2 + i;
        prefetch_l2(pre + (size_t)(grow + line / 4) * N + gcol + (line % 4) * 64);
      }
    };
    // This lane's pre at fragment column group j of chunk c.
    auto pre_at = [&](int c, int j) { return lds32(pre_slot(c) + off_base + ((j ^ r8) << 4)); };
#endif
#if GM_EPI == 3
    // dgelu_bgrad: the chunk's values of this lane as stored (bf16; its row, columns 8j + 2q + e at cs[2j + e], q =
    // lane % 4), reduced over the chunk's 8 rows to columns 8 r8 + 2q + {0, 1}; the two chunks of a 64-column group
    // (rows r8 and r8 + 8: half 0, then 1) added, and the warp's 16-row sums stored to colsums[grow0 / 16][col].
    float cs[16];
    float cs_half0[2];
    auto column_sums = [&](int half, int grow0, int gcol) {
      reduce_scatter_step<16, 16>(cs, lane);
      reduce_scatter_step<8, 8>(cs, lane);
      reduce_scatter_step<4, 4>(cs, lane);
      if (half == 0) {
        cs_half0[0] = cs[0];
        cs_half0[1] = cs[1];
      } else {
        float* dst = colsums + (size_t)(grow0 / 16) * N + gcol + 8 * r8 + 2 * (lane & 3);
        stg_f32x2(dst, cs_half0[0] + cs[0], cs_half0[1] + cs[1]);
      }
    };
#endif
    // DEFER: chunk c (= cg*2 + half) of the pending tile, from the packed bf16 sum; dgelu: pre of chunk c was
    // loaded ahead, and chunk c + PRE_AHEAD's (PRE_AHEAD 3, c >= 5: the running tile's chunk 2, 0 or 1, at (row0,
    // col0), unless this is the last tile's epilogue, `drain`) is loaded once this one's is used.
    auto deferred_chunk = [&](auto cc, auto drain, int row0, int col0) {
      constexpr int c = decltype(cc)::value, cg = c / 2, half = c % 2;
#if GM_HAS_PRE
      await_pre(c, decltype(drain)::value != 0);
#endif
      store_chunk(c, pend_n0 + cg * 64, pend_row0 + half * 8, [&](int j, unsigned& va, unsigned& vo) {
#if GM_EPI == 1
        va = hp[(cg * 8 + j) * 2 + half];
        vo = pack_bf16(gelu_tanh(bf16lo(va)), gelu_tanh(bf16hi(va)));
#elif GM_PLAIN_OUT
        vo = hp[(cg * 8 + j) * 2 + half];
#elif GM_EPI == 5
        const unsigned mm = hp[(cg * 8 + j) * 2 + half], rv = pre_at(c, j);
        vo = pack_bf16(bf16lo(mm) + bf16lo(rv), bf16hi(mm) + bf16hi(rv));
#else
        const unsigned mm = hp[(cg * 8 + j) * 2 + half], pv = pre_at(c, j);
        vo = pack_bf16(bf16lo(mm) * gelu_tanh_grad(bf16lo(pv)), bf16hi(mm) * gelu_tanh_grad(bf16hi(pv)));
#endif
#if GM_EPI == 3
        cs[2 * j] = bf16lo(vo);
        cs[2 * j + 1] = bf16hi(vo);
#endif
      });
#if GM_EPI == 3
      column_sums(half, pend_row0, pend_n0 + cg * 64);
#endif
#if GM_HAS_PRE
      // Chunk c + PRE_AHEAD's pre, into the slot whose last reader is done (chunk c - 1's pair, or chunk c's own
      // slot: store_chunk's __syncwarp follows every lane's reads).
      if constexpr (c + PRE_AHEAD <= 7) load_pre(c + PRE_AHEAD, pend_row0, pend_n0);
      else if constexpr (PRE_AHEAD == 3 && !decltype(drain)::value) load_pre(c == 5 ? 2 : c - 6, row0, col0);
#else
      (void)row0; (void)col0;
#endif
    };

    for (int unit = first_unit; unit < num_units; unit += unit_step) {
      int m0, n0;
      unit_origin(unit, rank, m0, n0);
      const int row0 = m0 + cw * 64 + warp * 16;
#if GM_EPI == 6
      sum_nt = n0 / BN;
      sum_row0 = row0;
#endif

#if GM_HAS_PRE
      prefetch_pre_l2(row0, n0);
      // The epilogue's first chunks, while the mainloop runs: without DEFER this tile's; with DEFER and PRE_AHEAD 3
      // the deferred epilogue of the previous tile copies them (deferred_chunk), here only where there is none.
      if (!DEFER || (PRE_AHEAD == 3 && pend_row0 < 0)) load_first_pre(row0, n0);
#endif
      // ---- mainloop (keeps 1 wgmma group in flight) ----
      int kb = 0;
      if constexpr (DEFER) {
        // Epilogue chunk c of the previous tile runs in k-slice c KB / 8, spread over the mainloop: its ALU/MUFU
        // work and smem stores run while the tensor cores chew on this tile, and past what a k-slice's wgmmas
        // hide they hold back the next k-slice's issue. Needs K/64 >= 8.
        const bool pend = pend_row0 >= 0;
        auto step = [&](auto cc) {
#pragma unroll 1
          for (; kb < decltype(cc)::value * KB / 8; ++kb) kstep(kb, [] {});
          kstep(kb++, [&] { if (pend) deferred_chunk(cc, Int<0>{}, row0, n0); });
        };
        step(Int<0>{}); step(Int<1>{}); step(Int<2>{}); step(Int<3>{});
        step(Int<4>{}); step(Int<5>{}); step(Int<6>{}); step(Int<7>{});
      }
#pragma unroll 1
      for (; kb < KB; ++kb) kstep(kb, [] {});
      wgmma_wait<0>();
      acc_fence(acc);
      if (lane == 0) release(prev_s);
      // From here the producer is already streaming the next tile's A/B into the free stages.

      // ---- epilogue ----
      // Warp covers tile rows [64*cw + 16*warp, +16); fragment: d[4j+{0,1}] -> row r8,
      // cols 8j + 2*(lane%4) + {0,1}; d[4j+{2,3}] -> row r8+8, same cols.
#pragma unroll
      for (int cg = 0; cg < 4; ++cg) {                     // 64-column group
#if GM_HAS_BIAS
        unsigned bz[8];
#pragma unroll
        for (int j = 0; j < 8; ++j) bz[j] = __ldg(bias32 + ((n0 + cg * 64 + 8 * j) >> 1) + (lane & 3));
#endif
        // The sum at fragment column group j, row half `half`, element k (0, 1) of the pair; + bias (gelu_bias, bias).
        auto sum = [&](int j, int half, int k) {
          const float h = acc[(cg * 8 + j) * 4 + half * 2 + k];
#if GM_HAS_BIAS
          return h + (k ? bf16hi(bz[j]) : bf16lo(bz[j]));
#else
          return h;
#endif
        };
#pragma unroll
        for (int half = 0; half < 2; ++half) {             // rows r8 / r8+8
          if constexpr (DEFER) {
            // Only the sum (+ bias), rounded to bf16 (= aux for gelu_bias), is computed now; the epilogue's
            // arithmetic and the stores happen during the next tile's mainloop (or after the loop for the last tile).
#pragma unroll
            for (int j = 0; j < 8; ++j) hp[(cg * 8 + j) * 2 + half] = pack_bf16(sum(j, half, 0), sum(j, half, 1));
          } else {
#if GM_HAS_PRE
            await_pre(cg * 2 + half, false);               // this chunk's pre (copied PRE_AHEAD chunks ahead)
#endif
            store_chunk(cg * 2 + half, n0 + cg * 64, row0 + half * 8, [&](int j, unsigned& va, unsigned& vo) {
              const float h0 = sum(j, half, 0), h1 = sum(j, half, 1);
#if GM_EPI == 1
              va = pack_bf16(h0, h1);
              vo = pack_bf16(gelu_tanh(h0), gelu_tanh(h1));
#elif GM_PLAIN_OUT
              vo = pack_bf16(h0, h1);
#elif GM_EPI == 5
              const unsigned rv = pre_at(cg * 2 + half, j);
              vo = pack_bf16(h0 + bf16lo(rv), h1 + bf16hi(rv));
#else
              const unsigned pv = pre_at(cg * 2 + half, j);
              vo = pack_bf16(h0 * gelu_tanh_grad(bf16lo(pv)), h1 * gelu_tanh_grad(bf16hi(pv)));
#endif
#if GM_EPI == 3
              cs[2 * j] = bf16lo(vo);
              cs[2 * j + 1] = bf16hi(vo);
#endif
            });
#if GM_EPI == 3
            column_sums(half, row0, n0 + cg * 64);
#endif
#if GM_HAS_PRE
            // Chunk c + PRE_AHEAD's pre, into a slot whose last reader is done (as in deferred_chunk).
            const int c = cg * 2 + half;
            if (c + PRE_AHEAD <= 7) load_pre(c + PRE_AHEAD, row0, n0);
#endif
          }
        }
      }
      if constexpr (DEFER) {
        pend_row0 = row0; pend_n0 = n0;
#if GM_HAS_PRE
        // PRE_AHEAD 1: the first chunk's pre, used in the next tile's first k-slice.
        if (PRE_AHEAD == 1) load_first_pre(pend_row0, pend_n0);
#endif
      }
    }
    if constexpr (DEFER) {
      if (pend_row0 >= 0) {
        auto last = [&](auto cc) { deferred_chunk(cc, Int<1>{}, 0, 0); };
        last(Int<0>{}); last(Int<1>{}); last(Int<2>{}); last(Int<3>{});
        last(Int<4>{}); last(Int<5>{}); last(Int<6>{}); last(Int<7>{});
      }
    }
    if (lane == 0) bulk_wait_all();   // smem must stay alive until the stores have read it
  }
}

)GEMM";

struct GemmShape {
  int64_t M = 0, N = 0, K = 0;
  bool bKMajor = false;  // b given as [N, K] (transpose_b)
  int epilogue = 1;      // GM_EPI: 1 gelu_bias, 2 dgelu, 3 dgelu_bgrad, 4 bias, 5 bias_residual, 6 bgrad_a
  int cluster = 1;       // GM_CLUSTER: 2 where asked for (LoweringContext::ownGemmMulticast) and M / 128 is even
  int preAhead = 3;      // GM_PRE_AHEAD (LoweringContext::ownGemmPreAhead)
};

// Why `n` is not ours to run (empty: it is), and its shape.
std::string refusal(const Node& n, const LoweringContext& ctx, GemmShape* s) {
  const std::string kind = n.op() == OpKind::MatmulEpilogue ? n.getStr("epilogue") : "";
  const bool gelu = kind == "gelu_bias", bgrad = kind == "dgelu_bgrad", dgelu = kind == "dgelu" || bgrad;
  // bias_residual: matmul_epilogue {epilogue=bias} with a fourth operand, the residual r.
  const bool residual = kind == "bias" && n.numOperands() == 4, bias = kind == "bias" && !residual;
  const bool sumsA = kind == "bgrad_a";
  if (!gelu && !dgelu && !bias && !residual && !sumsA)
    return "takes matmul_epilogue {epilogue=gelu_bias}, {epilogue=bias} (with a residual or not), {epilogue=dgelu}, "
           "{epilogue=dgelu_bgrad} and {epilogue=bgrad_a}";
  if (gelu && !ctx.ownGeluGemm) return "gelu_bias: switched off (CudaOptions::ownGemm, TPC_OWN_GEMM; on by default)";
  if (bias && !ctx.ownBiasGemm) return "bias: switched off (CudaOptions::ownGemm, TPC_OWN_GEMM=bias or 1 turns it on)";
  if (residual && !ctx.ownBiasResidualGemm)
    return "bias_residual: switched off (CudaOptions::ownGemm, TPC_OWN_GEMM=bias_residual or 1 turns it on)";
  if (sumsA && !ctx.ownBgradAGemm) return "bgrad_a: switched off (CudaOptions::ownGemm, TPC_OWN_GEMM=bgrad_a or 1 turns it on)";
  if (kind == "dgelu" && !ctx.ownDgeluGemm) return "dgelu: switched off (CudaOptions::ownGemm, TPC_OWN_GEMM=dgelu or 1 turns it on)";
  if (bgrad && !ctx.ownDgeluBgradGemm)
    return "dgelu_bgrad: switched off (CudaOptions::ownGemm, TPC_OWN_GEMM=dgelu_bgrad or 1 turns it on)";
  if (ctx.smMajor != 9 || ctx.smMinor != 0) return "needs an sm_90 GPU (wgmma, TMA)";
  if (ctx.maxSharedBytes < static_cast<int64_t>(kSharedBytes)) return cat("needs ", kSharedBytes, " bytes of shared memory a block");
  if (n.numOperands() != (residual ? 4 : sumsA ? 2 : 3) || n.numResults() != (kind == "dgelu" || bias || residual ? 1 : 2))
    return gelu ? "takes gelu_bias without a residual: (a, b, bias) -> (y, pre)"
           : bias ? "takes bias without a residual: (a, b, bias) -> y"
           : residual ? "takes bias_residual as (a, b, bias, r) -> y"
           : sumsA ? "takes bgrad_a as (a, b) -> (y, db)"
           : bgrad ? "takes dgelu_bgrad as (a, b, pre) -> (g, db)" : "takes dgelu as (a, b, pre) -> g";
  for (const Value* v : n.operands())
    if (v->dtype() != DType::bf16) return "takes bf16 operands and results";
  for (const Value* v : n.results())
    if (v->dtype() != DType::bf16) return "takes bf16 operands and results";
  const Value *a = n.operand(0), *b = n.operand(1);
  if (n.getBool("transpose_a") || b->type().rank() != 2 || a->type().rank() < 2) return "takes a[..., M, K] x b[K, N] (or b^T)";
  s->epilogue = gelu ? 1 : bias ? 4 : residual ? 5 : sumsA ? 6 : bgrad ? 3 : 2;
  s->bKMajor = n.getBool("transpose_b");
  s->K = a->shape().back();
  s->N = s->bKMajor ? b->shape()[0] : b->shape()[1];
  s->M = s->K ? a->type().numel() / s->K : 0;
  if (s->M % kTileM || s->N % kTileN || s->K % kTileK || !s->M || !s->N || !s->K)
    return cat("needs M % ", kTileM, ", N % ", kTileN, " and K % ", kTileK, " to be 0 (M ", s->M, ", N ", s->N, ", K ", s->K, ")");
  if (s->M >= (int64_t(1) << 31) || s->N >= (int64_t(1) << 31) || s->K >= (int64_t(1) << 31)) return "needs dims under 2^31 (TMA coordinates)";
  if (dgelu && n.operand(2)->type().numel() != s->M * s->N) return "takes pre of the product's shape";
  if (!dgelu && !sumsA && n.operand(2)->type().numel() != s->N) return "takes a bias of one value a column";
  if (sumsA && n.result(1)->type().numel() != s->K) return "takes bgrad_a's db as one value a column of a";
  if (residual && n.operand(3)->type().numel() != s->M * s->N) return "takes a residual of the product's shape";
  if (bgrad && n.result(1)->type().numel() != s->N) return "takes dgelu_bgrad's db as one value a column";
  s->cluster = ctx.ownGemmMulticast && (s->M / kTileM) % 2 == 0 ? 2 : 1;
  // gelu_bias and bias have no pre: one source either way. bias_residual copies r as dgelu copies pre.
  s->preAhead = !(dgelu || residual) || ctx.ownGemmPreAhead == 1 ? 1 : 3;
  return "";
}

}  // namespace

const char* gemmSm90Ptx() { return kGemmPtx; }

Status setOwnGemmKinds(const std::string& kinds, const char* from, LoweringContext* ctx) {
  ctx->ownGeluGemm = ctx->ownBiasGemm = ctx->ownBiasResidualGemm = ctx->ownDgeluGemm = ctx->ownDgeluBgradGemm = false;
  ctx->ownBgradAGemm = ctx->ownGemmMulticast = false;
  ctx->ownGemmPreAhead = 3;
  if (kinds.empty() || kinds == "0") return {};
  size_t at = 0;
  while (at <= kinds.size()) {
    size_t end = std::min(kinds.find(',', at), kinds.size());
    std::string kind = kinds.substr(at, end - at);
    if (kind == "1" || kind == "all")
      ctx->ownGeluGemm = ctx->ownBiasGemm = ctx->ownBiasResidualGemm = ctx->ownDgeluGemm = ctx->ownDgeluBgradGemm =
          ctx->ownBgradAGemm = true;
    else if (kind == "gelu_bias") ctx->ownGeluGemm = true;
    else if (kind == "bias") ctx->ownBiasGemm = true;
    else if (kind == "bias_residual") ctx->ownBiasResidualGemm = true;
    else if (kind == "dgelu") ctx->ownDgeluGemm = true;
    else if (kind == "dgelu_bgrad") ctx->ownDgeluBgradGemm = true;
    else if (kind == "bgrad_a") ctx->ownBgradAGemm = true;
    else if (kind == "multicast") ctx->ownGemmMulticast = true;
    else if (kind == "pre1") ctx->ownGemmPreAhead = 1;
    else
      return makeError(from, "='", kinds, "': '", kind, "' is not a kind our GEMM kernel runs (expected 0, or a comma ",
                       "list of 1 or all (every kind), gelu_bias, bias, bias_residual, dgelu, dgelu_bgrad, bgrad_a, multicast ",
                       "(blocks in pairs sharing b's tiles) and pre1 (dgelu's pre copied one chunk ahead))");
    at = end + 1;
  }
  const bool any = ctx->ownGeluGemm || ctx->ownBiasGemm || ctx->ownBiasResidualGemm || ctx->ownDgeluGemm ||
                   ctx->ownDgeluBgradGemm || ctx->ownBgradAGemm;
  if (ctx->ownGemmMulticast && !any)
    return makeError(from, "='", kinds, "': multicast is a way to run the kinds, name one too (e.g. all,multicast)");
  if (ctx->ownGemmPreAhead == 1 && !any)
    return makeError(from, "='", kinds, "': pre1 is a way to run the kinds, name one too (e.g. dgelu,pre1)");
  return {};
}

bool ownGemm(const Node& n, const LoweringContext& ctx) {
  GemmShape s;
  return refusal(n, ctx, &s).empty();
}

Result<NodeLowering> lowerGemm(const Node& n, const LoweringContext& ctx) {
  GemmShape s;
  if (std::string why = refusal(n, ctx, &s); !why.empty()) return makeError("gemm_sm90: ", n.opName(), ": ", why);
  int64_t tiles = (s.M / kTileM) * (s.N / kTileN);
  KernelSpec k;
  static const char* const kEntry[] = {nullptr, "gemm_gelu_kernel", "gemm_dgelu_kernel", "gemm_dgelu_bgrad_kernel",
                                       "gemm_bias_kernel", "gemm_bias_residual_kernel", "gemm_bgrad_a_kernel"};  // by GM_EPI
  k.entry = kEntry[s.epilogue];
  k.archSpecific = true;
  k.source = cat("#define GM_M ", s.M, "\n#define GM_N ", s.N, "\n#define GM_K ", s.K, "\n#define GM_B_KMAJOR ", s.bKMajor ? 1 : 0,
                 "\n#define GM_MODE ", s.K >= 8 * kTileK ? 2 : 1, "\n#define GM_EPI ", s.epilogue, "\n#define GM_SMEM_BYTES ",
                 kSharedBytes, "\n#define GM_CLUSTER ", s.cluster, "\n#define GM_PRE_AHEAD ", s.preAhead, "\n", kGemmHead, kGemmPtx, kGemmBody);
  // A block a SM; in clusters of two, an even count (the loader lowers it to the pairs that fit at once).
  int64_t blocks = std::min<int64_t>(tiles, std::max(ctx.numSMs, 1));
  if (s.cluster == 2) blocks = std::max<int64_t>(2, blocks / 2 * 2);
  k.grid.x = static_cast<uint32_t>(blocks);
  k.clusterX = static_cast<uint32_t>(s.cluster);
  k.block.x = 384;
  k.sharedBytes = kSharedBytes;
  k.requiredRegisters = 168;  // setmaxnreg: 128 producer threads give 128 each (to 40), 256 consumers take 64 (to 232)
  auto box = [](bool operand, int64_t index, int64_t rows, int64_t cols, uint32_t boxRows) {
    return TensorMapSpec{operand, index, rows, cols, boxRows, 64};
  };
  k.maps = {box(true, 0, s.M, s.K, 128),
            s.bKMajor ? box(true, 1, s.N, s.K, static_cast<uint32_t>(kTileN / s.cluster)) : box(true, 1, s.K, s.N, 64),
            box(false, 0, s.M, s.N, 8)};
  k.args = {{ArgKind::TensorMap, 0}, {ArgKind::TensorMap, 1}, {ArgKind::TensorMap, 2}};
  if (s.epilogue == 1) {  // then aux (pre) and the bias
    k.maps.push_back(box(false, 1, s.M, s.N, 8));
    k.args.push_back({ArgKind::TensorMap, 3});
  }
  if (s.epilogue != 6) k.args.push_back({ArgKind::Operand, 2});  // the bias, or pre
  if (s.epilogue == 5) k.args.push_back({ArgKind::Operand, 3});  // then the residual
  NodeLowering l;
  if (s.epilogue == 3 || s.epilogue == 6) {  // the warps' 16-row column sums (of g, or of a), then db = theirs in order
    const int64_t partials = s.M / 16, cols = s.epilogue == 3 ? s.N : s.K;
    const std::string entry = s.epilogue == 3 ? "tpc_dgelu_bgrad_columns" : "tpc_bgrad_a_columns";
    k.args.push_back(workspaceArg(0));
    l.workspaceBytes = partials * cols * 4;
    l.kernels.push_back(std::move(k));
    KernelSpec c;
    c.entry = entry;
    c.source = devicePrelude() + accessors("db", n.result(1)->dtype()) + R"(
extern "C" __global__ void __launch_bounds__(1024) )" + entry + R"((const float* part, db_t* DB) {
  __shared__ double red[32 * 33];
  const i64 col = (i64)blockIdx.x * 32 + threadIdx.x;
  const double v = tpc_column_sum(part, )" + i64Lit(partials) + ", " + i64Lit(cols) + R"(, col, red);
  if (threadIdx.y == 0 && col < )" + i64Lit(cols) + R"() db_st(DB, col, (float)v);
}
)";
    // 32 columns a block. 8 a block (384-512 blocks instead of 72-128, the same order and bits) measured no
    // faster in the step on an H100 (twenty-seventh session: gpt2-medium's 49 bias sums 0.635 ms).
    c.block = {32, 32, 1};
    c.grid = {static_cast<uint32_t>((cols + 31) / 32), 1, 1};
    c.args = {workspaceArg(0), resultArg(1)};
    l.kernels.push_back(std::move(c));
    return l;
  }
  l.kernels.push_back(std::move(k));
  return l;
}

}  // namespace tpc::cuda
