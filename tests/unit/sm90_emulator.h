// A CPU emulation of the sm_90 features our GEMM kernel (runtime/cuda/kernels/gemm_sm90.cpp) uses, so that its
// indexing, its barriers and the order of its asynchronous copies are checked without a GPU: the kernel's source
// with its PTX part (gemmSm90Ptx()) replaced by the functions below is compiled by the host C++ compiler; every CUDA
// thread is a std::thread, the blocks of the persistent grid run at once (a cluster's two blocks share barriers and
// multicasts), and shared memory starts as NaN bytes.
//
// The asynchronous operations run as late or as early as the PTX rules allow, in one of two modes, so that a
// missing wait shows up as wrong numbers rather than as luck:
//   kLateReads (0): writes into shared memory land at issue (TMA loads, cp.async), reads of it happen at the last
//                   moment (a wgmma at its wgmma.wait_group, a TMA store at its cp.async.bulk.wait_group.read):
//                   a stage released or a slot reused too early is caught;
//   kLateWrites (1): writes land at the last moment (a TMA load when a thread waits on its barrier, a cp.async at
//                   its wait_group), reads happen at issue: data used before it is waited for is caught.
// A wgmma's accumulators are written when it runs, so reading them before wgmma.wait_group is caught in mode 0.
// Also caught: a TMA store of shared memory written without fence.proxy.async since; a thread that exits with
// TMA stores, cp.async or wgmma groups it never waited for; an arrival, multicast or load landing in a block whose
// threads have all exited (its shared memory is gone); a barrier left mid-phase at the end; misaligned TMA, cp.async
// and mbarrier addresses (the dynamic shared memory starts 16-byte but not 1 KB aligned, so the kernel's own
// alignment is exercised); a warp, block or cluster barrier or an mbarrier wait that is not met within 15 s.
// Not modelled: wgmma.fence (a warp barrier here), fence.mbarrier_init, cluster-scope acquire and release, the
// hardware's own reading of the matrix descriptors and of the wgmma transpose bit, cvt's operand order and the
// multicast mask: the emulator reads those as the kernel's comments define them, the GPU test checks them. Not a
// performance model.
#pragma once

#include <dlfcn.h>

#include <cstdlib>
#include <fstream>
#include <string>

#include "ir/status.h"

namespace tpc::test {

inline const char* sm90EmulatorShim() {
  return R"SHIM(
#include <algorithm>
#include <atomic>
#include <barrier>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>
struct uint3 { unsigned x = 0, y = 0, z = 0; };
static thread_local uint3 threadIdx, blockIdx;
static uint3 blockDim, gridDim;
#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __grid_constant__

// A TMA load held back (mode 1) until a thread waits on its barrier; a multicast is queued in both blocks and lands
// once, with whichever waits first.
struct EmuLate { bool done = false; std::function<void()> land; };
struct EmuBar {
  unsigned count = 0, pending = 0, phase = 0;
  long long tx = 0;
  std::vector<std::shared_ptr<EmuLate>> late;
  size_t queued() const { return std::count_if(late.begin(), late.end(), [](const auto& l) { return !l->done; }); }
};
static void emu_fail(const std::string& what);
static std::string emu_who();
static std::atomic<bool> emu_failed{false};
// A barrier of n threads (__syncwarp, __syncthreads, barrier.cluster) that gives up after 15 s, or at once after any
// failure, instead of hanging the test.
struct EmuBarrier {
  explicit EmuBarrier(unsigned n, const char* what) : count(n), what(what) {}
  void arrive_and_wait() {
    std::unique_lock<std::mutex> l(mu);
    const unsigned long long gen = generation;
    if (++arrived == count) {
      arrived = 0;
      ++generation;
      cv.notify_all();
      return;
    }
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(15);
    while (generation == gen && !emu_failed) {
      cv.wait_for(l, std::chrono::milliseconds(100));
      if (generation == gen && std::chrono::steady_clock::now() > deadline) {
        l.unlock();
        emu_fail(emu_who() + ": waited 15 s at a " + what + " barrier (" + std::to_string(arrived) + " of " +
                 std::to_string(count) + " threads there)");
        return;
      }
    }
  }
  std::mutex mu;
  std::condition_variable cv;
  unsigned count, arrived = 0;
  unsigned long long generation = 0;
  const char* what;
};
constexpr unsigned kEmuDynOffset = 0x50;  // the dynamic shared memory's start in the block's window: 16-B aligned only
struct EmuCluster;
struct EmuBlock {
  std::vector<unsigned char> storage;
  unsigned char* smem = nullptr;          // the block's shared window (address 0), 1 KB aligned
  size_t smemBytes = 0;                   // dynamic shared memory, from kEmuDynOffset
  std::map<unsigned, EmuBar> bars;
  std::unique_ptr<EmuBarrier> block;
  std::vector<std::unique_ptr<EmuBarrier>> warps;
  std::vector<unsigned long long> slots;
  std::vector<unsigned short> unfenced;   // per 4-byte word: 1 + the thread whose generic write is not yet fenced
  std::atomic<unsigned> live{0};          // threads still running; 0: the block has exited
  bool dead = false;                      // under emu_mu
  unsigned rank = 0;
  EmuCluster* cluster = nullptr;
};
struct EmuCluster { std::vector<EmuBlock*> blocks; std::unique_ptr<EmuBarrier> bar; unsigned id = 0; };
static int emu_mode = 0;
static unsigned emu_clusters = 1;
static std::recursive_mutex emu_mu;       // every barrier's state and the error (recursive: emu_fail under it)
static std::condition_variable_any emu_cv;
static std::string emu_error;
static std::vector<std::pair<const unsigned char*, size_t>> emu_ranges;  // the global buffers the kernel may touch
static thread_local EmuBlock* emu_blk;
static thread_local unsigned emu_tid;

static void emu_fail(const std::string& what) {
  std::lock_guard<std::recursive_mutex> l(emu_mu);
  if (!emu_failed.exchange(true)) emu_error = what;
  emu_cv.notify_all();
}
static std::string emu_who() {  // the thread that runs the operation (a late load: the one that waited for it)
  return "block " + std::to_string(blockIdx.x) + " thread " + std::to_string(emu_tid);
}
static bool emu_global_ok(const void* p, size_t n) {
  const unsigned char* c = static_cast<const unsigned char*>(p);
  for (const auto& [b, len] : emu_ranges)
    if (c >= b && c + n <= b + len) return true;
  return false;
}
static unsigned char* emu_smem_at(EmuBlock* b, unsigned addr, size_t n) {
  if (addr < kEmuDynOffset || addr + n > kEmuDynOffset + b->smemBytes) {
    emu_fail(emu_who() + ": shared memory access at " + std::to_string(addr) + " outside the block's " +
             std::to_string(b->smemBytes) + " bytes from " + std::to_string(kEmuDynOffset));
    static unsigned char sink[64];
    return sink;
  }
  return b->smem + addr;
}
// 128-byte swizzle: the 16-byte chunk index (address bits 4-6) XOR the row within 8 (bits 7-9).
static unsigned emu_swz(unsigned a) { return a ^ (((a >> 7) & 7u) << 4); }
static void emu_aligned(unsigned long long a, unsigned n, const char* what) {
  if (a % n) emu_fail(emu_who() + ": " + what + " at " + std::to_string(a) + ", not " + std::to_string(n) + "-byte aligned");
}

inline float __uint_as_float(unsigned i) { float f; std::memcpy(&f, &i, 4); return f; }
inline float __fmaf_rn(float a, float b, float c) { return std::fma(a, b, c); }
inline float __fdividef(float a, float b) { return a / b; }
template <class T> inline T __ldg(const T* p) {
  if (!emu_global_ok(p, sizeof(T))) emu_fail(emu_who() + ": __ldg outside the kernel's buffers");
  return *p;
}
inline void __syncthreads() { emu_blk->block->arrive_and_wait(); }
inline void __syncwarp() { emu_blk->warps[emu_tid / 32]->arrive_and_wait(); }
template <class T> T __shfl_xor_sync(unsigned, T v, int o) {
  static_assert(sizeof(T) <= 8);
  unsigned w = emu_tid / 32, lane = emu_tid % 32;
  unsigned long long bits = 0;
  std::memcpy(&bits, &v, sizeof(T));
  emu_blk->slots[emu_tid] = bits;
  emu_blk->warps[w]->arrive_and_wait();
  bits = emu_blk->slots[w * 32 + (lane ^ (unsigned)o)];
  emu_blk->warps[w]->arrive_and_wait();
  T r;
  std::memcpy(&r, &bits, sizeof(T));
  return r;
}

// Per-thread queues of what is in flight: cp.async groups, TMA store (bulk) groups, wgmma groups.
struct EmuGroups {
  std::vector<std::function<void()>> open;
  std::vector<std::vector<std::function<void()>>> done;   // committed, oldest first
  void commit() { done.push_back(std::move(open)); open.clear(); }
  void run_all_but(size_t n) {
    while (done.size() > n) {
      for (auto& f : done.front()) f();
      done.erase(done.begin());
    }
  }
  size_t pending() const { return open.size() + done.size(); }
};
static thread_local EmuGroups emu_cp, emu_bulk, emu_mma;
)SHIM";
}

// The functions of gemmSm90Ptx(), emulated.
inline const char* sm90EmulatedPtx() {
  return R"SHIM(
#define GM_DYNAMIC_SMEM(name) unsigned char* name = emu_blk->smem + kEmuDynOffset
#define GM_CLUSTER_DIMS
inline unsigned smem_addr(const void* p) { return (unsigned)((const unsigned char*)p - emu_blk->smem); }

static EmuBar& emu_bar(EmuBlock* b, unsigned addr) {  // emu_mu held
  auto it = b->bars.find(addr);
  if (it == b->bars.end()) {
    emu_fail(emu_who() + ": mbarrier at " + std::to_string(addr) + " used before mbarrier.init");
    return b->bars[addr];
  }
  return it->second;
}
static void emu_bar_check(EmuBar& m) {  // emu_mu held: the phase completes with its arrivals and bytes
  if (m.pending == 0 && m.tx == 0) {
    ++m.phase;
    m.pending = m.count;
    emu_cv.notify_all();
  }
}
static void emu_arrive(EmuBlock* b, unsigned bar, long long bytes) {
  std::lock_guard<std::recursive_mutex> l(emu_mu);
  if (b->dead) { emu_fail(emu_who() + ": arrives on an mbarrier of a block that has exited"); return; }
  EmuBar& m = emu_bar(b, bar);
  if (m.pending == 0) { emu_fail(emu_who() + ": more arrivals on mbarrier " + std::to_string(bar) + " than its count"); return; }
  m.tx += bytes;
  --m.pending;
  emu_bar_check(m);
}
static void emu_complete_tx(EmuBlock* b, unsigned bar, long long bytes) {  // emu_mu held
  EmuBar& m = emu_bar(b, bar);
  m.tx -= bytes;
  emu_bar_check(m);
}
inline void mbar_init(unsigned bar, unsigned count) {
  emu_aligned(bar, 8, "an mbarrier");
  std::lock_guard<std::recursive_mutex> l(emu_mu);
  EmuBar& m = emu_blk->bars[bar];
  m = EmuBar{};
  m.count = m.pending = count;
}
inline void mbar_expect_tx(unsigned bar, unsigned bytes) { emu_arrive(emu_blk, bar, (long long)bytes); }
inline void mbar_arrive(unsigned bar) { emu_arrive(emu_blk, bar, 0); }
inline void mbar_arrive_cluster(unsigned bar, unsigned cta) {
  if (!emu_blk->cluster || cta >= emu_blk->cluster->blocks.size()) { emu_fail(emu_who() + ": mapa to a block outside the cluster"); return; }
  emu_arrive(emu_blk->cluster->blocks[cta], bar, 0);
}
inline unsigned cluster_reg_rank() { return emu_blk->rank; }
inline unsigned cluster_reg_id() { return emu_blk->cluster->id; }
inline unsigned cluster_reg_count() { return emu_clusters; }
inline void cluster_sync() { emu_blk->cluster->bar->arrive_and_wait(); }
inline void fence_mbar_init() {}
// Waits until the phase of this parity has completed (the barrier's current phase has the other parity). In mode
// 1 the TMA loads that complete on this barrier land now, when a thread first needs them.
template <bool PRODUCER>
inline void mbar_wait(unsigned bar, unsigned parity) {
  std::unique_lock<std::recursive_mutex> l(emu_mu);
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(15);
  for (;;) {
    if (emu_failed) return;
    EmuBar& m = emu_bar(emu_blk, bar);
    if ((m.phase & 1u) != (parity & 1u)) return;
    if (!m.late.empty()) {
      auto late = std::move(m.late);
      m.late.clear();
      for (auto& f : late)
        if (!f->done) {
          f->done = true;
          f->land();
        }
      continue;
    }
    if (emu_cv.wait_until(l, deadline) == std::cv_status::timeout) {
      if ((emu_bar(emu_blk, bar).phase & 1u) != (parity & 1u)) return;
      std::string state;
      for (const auto& [at, b] : emu_blk->bars)
        state += " @" + std::to_string(at) + " phase " + std::to_string(b.phase) + " pending " + std::to_string(b.pending) +
                 " tx " + std::to_string(b.tx) + (b.queued() ? " (loads queued);" : ";");
      emu_fail(emu_who() + (PRODUCER ? " (producer)" : " (consumer)") + ": waited 15 s on mbarrier " +
               std::to_string(bar) + " for parity " + std::to_string(parity) + " (a deadlock); this block's barriers:" + state);
      return;
    }
  }
}

// TmaDesc as the test fills it (sm90EmulatedMap): the global buffer, its inner and outer extents in elements, the
// row pitch in bytes and the box (inner, outer), bf16 elements, 128-byte swizzle.
struct EmuMap { const unsigned char* base; unsigned long long inner, outer, pitch, boxInner, boxOuter, magic; };
// By value: a copy in flight outlives the kernel parameter its descriptor came from.
static EmuMap emu_map(const TmaDesc* d) {
  EmuMap m;
  std::memcpy(&m, d, sizeof m);
  if (m.magic != 0x5390E0ull) emu_fail(emu_who() + ": a TMA descriptor the test did not fill");
  if (m.boxInner * 2 != 128) emu_fail(emu_who() + ": a 128-byte swizzled box must be 128 bytes wide");
  return m;
}
// Box (c0, c1) of the map between global memory and shared memory at `s` of block b (swizzled).
static void emu_box(EmuBlock* b, unsigned s, const EmuMap& m, int c0, int c1, bool load) {
  for (unsigned long long r = 0; r < m.boxOuter; ++r)
    for (unsigned long long c = 0; c < m.boxInner; ++c) {
      const unsigned a = emu_swz(s + (unsigned)(r * m.boxInner + c) * 2);
      unsigned char* sp = emu_smem_at(b, a, 2);
      const long long gr = c1 + (long long)r, gc = c0 + (long long)c;
      const bool in = gr >= 0 && gc >= 0 && gr < (long long)m.outer && gc < (long long)m.inner;
      unsigned char* gp = const_cast<unsigned char*>(m.base) + (in ? gr * m.pitch + gc * 2 : 0);
      if (load) {
        if (in) std::memcpy(sp, gp, 2);
        else std::memset(sp, 0, 2);
      } else if (in) {
        std::memcpy(gp, sp, 2);
      }
    }
}
static void emu_tma_load(unsigned dst, const TmaDesc* map, unsigned bar, int c0, int c1, bool multicast) {
  const EmuMap m = emu_map(map);
  const long long bytes = (long long)(m.boxInner * m.boxOuter * 2);
  std::vector<EmuBlock*> to;
  if (multicast) to = emu_blk->cluster->blocks;
  else to.push_back(emu_blk);
  emu_aligned(dst, 128, "a TMA load's destination");
  auto land = [=] {  // emu_mu held
    for (EmuBlock* b : to)
      if (b->dead) { emu_fail(emu_who() + ": a TMA load lands in a block that has exited"); return; }
    for (EmuBlock* b : to) emu_box(b, dst, m, c0, c1, true);
    for (EmuBlock* b : to) emu_complete_tx(b, bar, bytes);
  };
  std::lock_guard<std::recursive_mutex> l(emu_mu);
  if (emu_mode == 0) {
    land();
  } else {
    auto late = std::make_shared<EmuLate>();
    late->land = land;
    for (EmuBlock* b : to) emu_bar(b, bar).late.push_back(late);
    emu_cv.notify_all();   // a thread already waiting on the barrier lands it
  }
}
inline void tma_load_2d(unsigned dst, const TmaDesc* map, unsigned bar, int c0, int c1) { emu_tma_load(dst, map, bar, c0, c1, false); }
inline void tma_load_2d_multicast(unsigned dst, const TmaDesc* map, unsigned bar, int c0, int c1) { emu_tma_load(dst, map, bar, c0, c1, true); }
inline void tma_store_2d(const TmaDesc* map, unsigned src, int c0, int c1) {
  const EmuMap m = emu_map(map);
  EmuBlock* b = emu_blk;
  emu_aligned(src, 128, "a TMA store's source");
  auto store = [=] {
    // The async proxy reads it: every generic write to it must have been followed by fence.proxy.async.
    for (unsigned long long i = 0; i < m.boxInner * m.boxOuter * 2; i += 4)
      if (unsigned short w = b->unfenced[(src + i) / 4]) {
        emu_fail(emu_who() + ": a TMA store reads shared memory at " + std::to_string(src + i) + " that thread " +
                 std::to_string(w - 1) + " wrote without fence.proxy.async since");
        break;
      }
    emu_box(b, src, m, c0, c1, false);
  };
  if (emu_mode == 1) store();
  else emu_bulk.open.push_back(store);
}
inline void bulk_commit() { emu_bulk.commit(); }
template <int N> inline void bulk_wait_read() { emu_bulk.run_all_but(N); }
inline void bulk_wait_all() { emu_bulk.run_all_but(0); }
static thread_local std::vector<unsigned> emu_unfenced;  // this thread's words written since its last proxy fence
inline void fence_proxy_async() {
  for (unsigned w : emu_unfenced)
    if (emu_blk->unfenced[w] == emu_tid + 1) emu_blk->unfenced[w] = 0;
  emu_unfenced.clear();
}

// The wgmma instructions are .sync.aligned: a warp's threads meet at each (as a warp executes them converged), so
// that no lane runs ahead past a wgmma, e.g. to release a stage the others have not waited for yet.
inline void wgmma_fence() { __syncwarp(); }
inline void wgmma_commit() {
  __syncwarp();
  emu_mma.commit();
}
template <int N> inline void wgmma_wait() {   // the warp's lanes all compute their parts before any goes on
  __syncwarp();
  emu_mma.run_all_but(N);
  __syncwarp();
}
inline void acc_fence(float (&)[128]) {}
static float emu_bf16(EmuBlock* b, unsigned linear) {
  unsigned short h;
  std::memcpy(&h, emu_smem_at(b, emu_swz(linear), 2), 2);
  return __uint_as_float((unsigned)h << 16);
}
// The descriptor's fields (the kernel's make_desc / make_desc_mn): start, LBO and SBO in 16-byte units, 128-byte swizzle.
static void emu_desc(unsigned long long d, unsigned& start, unsigned& lbo, unsigned& sbo) {
  start = (unsigned)(d & 0x3FFFu) << 4;
  lbo = (unsigned)((d >> 16) & 0x3FFFu) << 4;
  sbo = (unsigned)((d >> 32) & 0x3FFFu) << 4;
  if ((d >> 62) != 1) emu_fail(emu_who() + ": a wgmma descriptor without the 128-byte swizzle");
  // The base offset says where the matrix starts within the swizzle's 1 KB pattern (address bits 7-9).
  if (((d >> 49) & 7u) != ((start >> 7) & 7u)) emu_fail(emu_who() + ": a wgmma descriptor whose base offset is not its start's");
}
// D[64 x 256] (+)= A[64 x 16] B[16 x 256], this thread's 128 accumulators: d[4j + e] is row 16 warp + lane / 4 +
// 8 (e / 2), column 8 j + 2 (lane % 4) + e % 2. A is K-major; B K-major (GM_B_KMAJOR) or N-major (atoms of 64 n x 8 k
// rows, LBO between atoms along n, SBO between 8-row groups along k).
inline void wgmma_m64n256k16(float (&d)[128], unsigned long long da, unsigned long long db, int scale_d) {
  __syncwarp();
  EmuBlock* b = emu_blk;
  const unsigned t = emu_tid % 128, w = t / 32, lane = t % 32;
  float* acc = d;
  auto run = [=] {
    unsigned sa, la, ba, sb, lb, bb;
    emu_desc(da, sa, la, ba);
    emu_desc(db, sb, lb, bb);
    float av[2][16];
    for (int h = 0; h < 2; ++h) {
      const unsigned row = 16 * w + lane / 4 + 8 * h;
      for (unsigned k = 0; k < 16; ++k) av[h][k] = emu_bf16(b, sa + (row / 8) * ba + (row % 8) * 128 + k * 2);
    }
    for (int i = 0; i < 128; ++i) {
      const unsigned j = i / 4, e = i % 4, col = 8 * j + 2 * (lane % 4) + (e & 1);
      float s = scale_d ? acc[i] : 0.0f;
      for (unsigned k = 0; k < 16; ++k) {
#if GM_B_KMAJOR
        const float bv = emu_bf16(b, sb + (col / 8) * bb + (col % 8) * 128 + k * 2);
#else
        const float bv = emu_bf16(b, sb + (col / 64) * lb + (k / 8) * bb + (k % 8) * 128 + (col % 64) * 2);
#endif
        s += av[e / 2][k] * bv;
      }
      acc[i] = s;
    }
  };
  if (emu_mode == 0) emu_mma.open.push_back(run);
  else run();
}

inline unsigned pack_bf16(float lo, float hi) {  // round to nearest even; NaN -> the canonical 0x7FFF
  auto one = [](float f) -> unsigned {
    unsigned u;
    std::memcpy(&u, &f, 4);
    if (std::isnan(f)) return 0x7FFFu;
    return (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
  };
  return one(lo) | (one(hi) << 16);
}
template <int N> inline void regs_dealloc() {}
template <int N> inline void regs_alloc() {}
inline void prefetch_tmap(const TmaDesc*) {}
inline void prefetch_l2(const void* p) {
  if (!emu_global_ok(p, 1)) emu_fail(emu_who() + ": prefetch.global.L2 outside the kernel's buffers");
}
inline void sts32(unsigned addr, unsigned v) {
  emu_aligned(addr, 4, "st.shared.b32");
  std::memcpy(emu_smem_at(emu_blk, addr, 4), &v, 4);
  emu_blk->unfenced[addr / 4] = (unsigned short)(emu_tid + 1);
  emu_unfenced.push_back(addr / 4);
}
inline unsigned lds32(unsigned addr) {
  emu_aligned(addr, 4, "ld.shared.b32");
  unsigned v;
  std::memcpy(&v, emu_smem_at(emu_blk, addr, 4), 4);
  return v;
}
inline void lds128(unsigned addr, unsigned& a, unsigned& b, unsigned& c, unsigned& d) {
  emu_aligned(addr, 16, "ld.shared.v4.b32");
  unsigned v[4];
  std::memcpy(v, emu_smem_at(emu_blk, addr, 16), 16);
  a = v[0], b = v[1], c = v[2], d = v[3];
}
inline void stg_f32x2(float* p, float a, float b) {
  if (!emu_global_ok(p, 8)) { emu_fail(emu_who() + ": st.global.v2.f32 outside the kernel's buffers"); return; }
  p[0] = a;
  p[1] = b;
}
inline void stg_f32x4(float* p, float a, float b, float c, float d) {
  if (!emu_global_ok(p, 16)) { emu_fail(emu_who() + ": st.global.v4.f32 outside the kernel's buffers"); return; }
  emu_aligned((unsigned long long)(uintptr_t)p, 16, "st.global.v4.f32");
  p[0] = a, p[1] = b, p[2] = c, p[3] = d;
}
inline void cp_async16(unsigned dst, const void* src) {
  if (!emu_global_ok(src, 16)) { emu_fail(emu_who() + ": cp.async from outside the kernel's buffers"); return; }
  emu_aligned(dst, 16, "a cp.async destination");
  emu_aligned((unsigned long long)(uintptr_t)src, 16, "a cp.async source");
  EmuBlock* b = emu_blk;
  auto copy = [=] { std::memcpy(emu_smem_at(b, dst, 16), src, 16); };
  if (emu_mode == 0) copy();
  else emu_cp.open.push_back(copy);
}
inline void cp_async_commit() { emu_cp.commit(); }
template <int N> inline void cp_async_wait() { emu_cp.run_all_but(N); }
inline float ex2_approx(float x) { return std::exp2(x); }
inline float rcp_approx(float x) { return 1.0f / x; }
)SHIM";
}

inline const char* sm90EmulatorLauncher() {
  return R"SHIM(
template <class... A, size_t... I>
void emu_call(void (*f)(A...), void** args, std::index_sequence<I...>) {
  f(*reinterpret_cast<std::remove_reference_t<A>*>(args[I])...);
}
template <class... A>
void emu_call2(void (*f)(A...), void** args) { emu_call(f, args, std::index_sequence_for<A...>{}); }
// ranges: pairs (pointer, bytes) of the global buffers, nranges of them. Returns "" or what went wrong.
extern "C" const char* tpc_sm90_launch(void** args, unsigned grid, unsigned cluster, unsigned threads, unsigned smem,
                                       int mode, void** ranges, unsigned nranges) {
  static std::string result;
  emu_mode = mode;
  emu_failed = false;
  emu_error.clear();
  emu_ranges.clear();
  for (unsigned i = 0; i < nranges; ++i) emu_ranges.push_back({(const unsigned char*)ranges[2 * i], (size_t)(uintptr_t)ranges[2 * i + 1]});
  if (cluster == 0 || grid % cluster) { result = "the grid is not a whole number of clusters"; return result.c_str(); }
  gridDim = {grid, 1, 1};
  blockDim = {threads, 1, 1};
  emu_clusters = grid / cluster;
  std::vector<std::unique_ptr<EmuBlock>> blocks;
  std::vector<std::unique_ptr<EmuCluster>> clusters;
  for (unsigned c = 0; c < emu_clusters; ++c) {
    clusters.push_back(std::make_unique<EmuCluster>());
    clusters.back()->id = c;
    clusters.back()->bar = std::make_unique<EmuBarrier>(threads * cluster, "cluster");
  }
  for (unsigned i = 0; i < grid; ++i) {
    auto b = std::make_unique<EmuBlock>();
    b->storage.assign(1024 + kEmuDynOffset + smem, 0xFF);   // NaN bf16 everywhere until written
    b->smem = b->storage.data() + (1024 - (uintptr_t)b->storage.data() % 1024) % 1024;
    b->smemBytes = smem;
    b->unfenced.assign((kEmuDynOffset + smem) / 4 + 1, 0);
    b->live = threads;
    b->block = std::make_unique<EmuBarrier>(threads, "block");
    for (unsigned w = 0; w < (threads + 31) / 32; ++w) b->warps.push_back(std::make_unique<EmuBarrier>(std::min(32u, threads - w * 32), "warp"));
    b->slots.assign(threads, 0);
    b->rank = i % cluster;
    b->cluster = clusters[i / cluster].get();
    b->cluster->blocks.push_back(b.get());
    blocks.push_back(std::move(b));
  }
  std::vector<std::thread> pool;
  try {
    for (unsigned i = 0; i < grid; ++i)
      for (unsigned t = 0; t < threads; ++t)
        pool.emplace_back([&, i, t] {
          emu_blk = blocks[i].get();
          emu_tid = t;
          threadIdx = {t, 0, 0};
          blockIdx = {i, 0, 0};
          emu_call2(TPC_EMU_ENTRY, args);
          // Nothing may be in flight when a thread exits: its shared memory goes with the block, TMA stores still
          // reading it included (cp.async.bulk.wait_group first); a cp.async or wgmma nobody waited for is data
          // never used.
          if (emu_bulk.pending() || emu_cp.pending() || emu_mma.pending())
            emu_fail(emu_who() + ": exits with " + std::to_string(emu_bulk.pending()) + " TMA store, " +
                     std::to_string(emu_cp.pending()) + " cp.async and " + std::to_string(emu_mma.pending()) +
                     " wgmma groups never waited for");
          if (--emu_blk->live == 0) {  // the block has exited: what lands in it from now on is a bug
            std::lock_guard<std::recursive_mutex> l(emu_mu);
            emu_blk->dead = true;
            std::fill(emu_blk->storage.begin(), emu_blk->storage.end(), 0xFF);
          }
        });
  } catch (const std::exception& e) {
    emu_fail(std::string("starting a thread for each CUDA thread: ") + e.what());
  }
  for (auto& th : pool) th.join();
  // Every barrier between phases: no bytes or arrivals outstanding, no load that never landed.
  for (unsigned i = 0; i < grid; ++i)
    for (const auto& [at, m] : blocks[i]->bars)
      if (m.tx != 0 || m.pending != m.count || m.queued())
        emu_fail("block " + std::to_string(i) + " ends with mbarrier " + std::to_string(at) + " mid-phase (" +
                 std::to_string(m.count - m.pending) + " of " + std::to_string(m.count) + " arrivals, " +
                 std::to_string(m.tx) + " bytes outstanding" + (m.queued() ? ", loads never landed)" : ")"));
  result = emu_failed ? emu_error : std::string();
  return result.c_str();
}
)SHIM";
}

using Sm90Launch = const char* (*)(void** args, unsigned grid, unsigned cluster, unsigned threads, unsigned smem,
                                   int mode, void** ranges, unsigned nranges);

// The fields of the emulated TmaDesc (EmuMap above), for a bf16 [outer, inner] row-major buffer and a box of
// boxOuter rows x boxInner elements.
struct alignas(64) Sm90EmulatedMap {
  const void* base;
  unsigned long long inner, outer, pitch, boxInner, boxOuter, magic = 0x5390E0ull;
  unsigned long long pad[16 - 7] = {};
};
static_assert(sizeof(Sm90EmulatedMap) == 128, "the kernel's TmaDesc is 128 bytes");

// The kernel source (lowerGemm's) rewritten for the emulator: `ptx` (gemmSm90Ptx()) replaced.
inline Result<std::string> sm90EmulatedSource(std::string src, const std::string& ptx, const std::string& entry) {
  const size_t at = src.find(ptx);
  if (at == std::string::npos) return makeError("emulator: the kernel source does not contain gemmSm90Ptx()");
  src.replace(at, ptx.size(), sm90EmulatedPtx());
  return std::string(sm90EmulatorShim()) + src + "\n#define TPC_EMU_ENTRY " + entry + "\n" + sm90EmulatorLauncher();
}

// Compiles one kernel for the emulator into `dir` and returns its launcher.
inline Result<Sm90Launch> compileSm90Emulated(const std::string& source, const std::string& ptx, const std::string& entry,
                                              const std::string& dir, int serial) {
  TPC_ASSIGN(std::string emulated, sm90EmulatedSource(source, ptx, entry));
  std::string base = dir + "/" + entry + "_" + std::to_string(serial);
  std::ofstream(base + ".cpp") << emulated;
  std::string cmd = "c++ -std=c++20 -O1 -w -shared -fPIC -pthread -o " + base + ".so " + base + ".cpp 2> " + base + ".log";
  if (std::system(cmd.c_str()) != 0) return makeError("emulator: compiling ", base, ".cpp failed, see ", base, ".log");
  void* h = dlopen((base + ".so").c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!h) return makeError("emulator: dlopen ", base, ".so: ", dlerror());
  void* fn = dlsym(h, "tpc_sm90_launch");
  if (!fn) return makeError("emulator: no tpc_sm90_launch in ", base, ".so");
  return reinterpret_cast<Sm90Launch>(fn);
}

}  // namespace tpc::test
