// A CPU emulation of the CUDA execution model, for running generated kernels where no GPU is present
// (a developer's check of indexing and synchronization, not a performance model): the kernel source is
// compiled by the host C++ compiler against a shim (one std::thread per CUDA thread, __syncthreads as a
// block barrier, warp shuffles through a per-warp barrier, blocks one after another so that __shared__
// becomes a function-local static). Only what the kernel families use is emulated.
#pragma once

#include <dlfcn.h>

#include <cstdlib>
#include <fstream>
#include <string>

#include "ir/status.h"
#include "runtime/cuda/kernels/device_prelude.h"

namespace tpc::test {

inline const char* cudaEmulatorShim() {
  return R"SHIM(
#include <atomic>
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>
using std::exp; using std::log; using std::sqrt; using std::pow; using std::fmin; using std::fmax;
struct uint3 { unsigned x = 0, y = 0, z = 0; };
static thread_local uint3 threadIdx, blockIdx;
static uint3 blockDim, gridDim;
static thread_local char* tpc_emu_smem;
struct TpcEmuBlock {
  std::barrier<>* block;
  std::vector<std::unique_ptr<std::barrier<>>> warps;
  std::vector<unsigned long long> slots;
  std::vector<unsigned> xch;  // 8 words per thread: mma fragments exchanged within a warp
};
static TpcEmuBlock* tpc_emu_state;
static thread_local unsigned tpc_emu_tid;
#define __global__
#define __device__
#define __forceinline__ inline
#define __shared__ static
#define __constant__
#define __launch_bounds__(...)
#define __align__(n) alignas(n)
struct alignas(16) uint4 { unsigned x, y, z, w; };
struct alignas(8) uint2 { unsigned x, y; };
inline void __syncthreads() { tpc_emu_state->block->arrive_and_wait(); }
template <class T> T __shfl_xor_sync(unsigned, T v, int o) {
  static_assert(sizeof(T) <= 8);
  unsigned w = tpc_emu_tid / 32, lane = tpc_emu_tid % 32;
  unsigned long long bits = 0;
  std::memcpy(&bits, &v, sizeof(T));
  tpc_emu_state->slots[tpc_emu_tid] = bits;
  tpc_emu_state->warps[w]->arrive_and_wait();
  bits = tpc_emu_state->slots[w * 32 + (lane ^ (unsigned)o)];
  tpc_emu_state->warps[w]->arrive_and_wait();
  T r;
  std::memcpy(&r, &bits, sizeof(T));
  return r;
}
template <class T> T __shfl_sync(unsigned, T v, int src) {
  static_assert(sizeof(T) <= 8);
  unsigned w = tpc_emu_tid / 32;
  unsigned long long bits = 0;
  std::memcpy(&bits, &v, sizeof(T));
  tpc_emu_state->slots[tpc_emu_tid] = bits;
  tpc_emu_state->warps[w]->arrive_and_wait();
  bits = tpc_emu_state->slots[w * 32 + ((unsigned)src & 31u)];
  tpc_emu_state->warps[w]->arrive_and_wait();
  T r;
  std::memcpy(&r, &bits, sizeof(T));
  return r;
}
inline unsigned __ballot_sync(unsigned, bool p) {  // the whole warp votes (the kernels pass a full mask)
  unsigned w = tpc_emu_tid / 32;
  tpc_emu_state->slots[tpc_emu_tid] = p ? 1 : 0;
  tpc_emu_state->warps[w]->arrive_and_wait();
  unsigned bits = 0;
  for (size_t l = w * 32; l < w * 32 + 32 && l < tpc_emu_state->slots.size(); ++l)
    bits |= (tpc_emu_state->slots[l] != 0 ? 1u : 0u) << (l - w * 32);
  tpc_emu_state->warps[w]->arrive_and_wait();
  return bits;
}
inline int __ffs(unsigned x) { return x ? __builtin_ctz(x) + 1 : 0; }
inline bool __any_sync(unsigned, bool p) {  // the whole warp votes (the kernels pass a full mask)
  unsigned w = tpc_emu_tid / 32;
  tpc_emu_state->slots[tpc_emu_tid] = p ? 1 : 0;
  tpc_emu_state->warps[w]->arrive_and_wait();
  bool any = false;
  for (size_t l = w * 32; l < w * 32 + 32 && l < tpc_emu_state->slots.size(); ++l) any |= tpc_emu_state->slots[l] != 0;
  tpc_emu_state->warps[w]->arrive_and_wait();
  return any;
}
inline float __int_as_float(int i) { float f; std::memcpy(&f, &i, 4); return f; }
inline float __uint_as_float(unsigned i) { float f; std::memcpy(&f, &i, 4); return f; }
inline unsigned __float_as_uint(float f) { unsigned i; std::memcpy(&i, &f, 4); return i; }
inline double __longlong_as_double(long long i) { double d; std::memcpy(&d, &i, 8); return d; }
inline float __fmul_rn(float a, float b) { volatile float r = a * b; return r; }  // one rounded product
inline unsigned __umulhi(unsigned a, unsigned b) { return (unsigned)(((unsigned long long)a * b) >> 32); }
template <class T> T min(T a, T b) { return b < a ? b : a; }
inline int atomicAdd(int* p, int v) { return std::atomic_ref<int>(*p).fetch_add(v); }
inline float tpc_emu_h2f(unsigned short h) { _Float16 x; std::memcpy(&x, &h, 2); return (float)x; }
inline unsigned short tpc_emu_f2h(float f) { _Float16 x = (_Float16)f; unsigned short h; std::memcpy(&h, &x, 2); return h; }
)SHIM";
}

inline const char* cudaEmulatorLauncher() {
  return R"SHIM(
template <class... A, size_t... I>
void tpc_emu_call(void (*f)(A...), void** args, std::index_sequence<I...>) {
  f(*reinterpret_cast<std::remove_reference_t<A>*>(args[I])...);
}
template <class... A>
void tpc_emu_call2(void (*f)(A...), void** args) { tpc_emu_call(f, args, std::index_sequence_for<A...>{}); }
extern "C" void tpc_emu_launch(void** args, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                               unsigned bz, unsigned shared) {
  gridDim = {gx, gy, gz};
  blockDim = {bx, by, bz};
  unsigned n = bx * by * bz;
  std::vector<char> dyn(shared + 16);
  for (unsigned z = 0; z < gz; ++z)
    for (unsigned y = 0; y < gy; ++y)
      for (unsigned x = 0; x < gx; ++x) {
        std::barrier<> block(n);
        TpcEmuBlock st;
        st.block = &block;
        for (unsigned w = 0; w < (n + 31) / 32; ++w) st.warps.push_back(std::make_unique<std::barrier<>>(std::min(32u, n - w * 32)));
        st.slots.assign(n, 0);
        st.xch.assign(size_t(n) * 8, 0);
        tpc_emu_state = &st;
        std::vector<std::thread> threads;
        for (unsigned t = 0; t < n; ++t)
          threads.emplace_back([&, t] {
            tpc_emu_tid = t;
            threadIdx = {t % bx, (t / bx) % by, t / (bx * by)};
            blockIdx = {x, y, z};
            tpc_emu_smem = dyn.data();
            tpc_emu_call2(TPC_EMU_ENTRY, args);
          });
        for (auto& th : threads) th.join();
      }
}
)SHIM";
}

// Host versions of device_prelude.h's tensorCorePrelude(): mma.sync and ldmatrix as exchanges within a warp
// (every lane publishes its fragment registers or row address, then computes its own outputs), f32 sums.
inline const char* emulatedTensorCorePrelude() {
  return R"SHIM(
struct alignas(16) tpc_u32x4 { u32 x, y, z, w; };
inline float tpc_emu_half(u32 w, int hi, bool f16) {
  unsigned short h = (unsigned short)(hi ? w >> 16 : w & 0xffffu);
  return f16 ? tpc_emu_h2f(h) : tpc_bf16_to_f32(h);
}
inline void tpc_emu_mma(float* c, const u32* a, const u32* b, bool f16) {
  unsigned w = tpc_emu_tid / 32, lane = tpc_emu_tid % 32, g = lane >> 2, t = lane & 3;
  std::vector<unsigned>& x = tpc_emu_state->xch;
  for (int i = 0; i < 4; ++i) x[tpc_emu_tid * 8 + i] = a[i];
  x[tpc_emu_tid * 8 + 4] = b[0];
  x[tpc_emu_tid * 8 + 5] = b[1];
  tpc_emu_state->warps[w]->arrive_and_wait();
  auto at = [&](unsigned src, unsigned reg, unsigned k) {
    return tpc_emu_half(x[(w * 32 + src) * 8 + reg], k & 1, f16);
  };
  for (unsigned e = 0; e < 4; ++e) {
    unsigned r = g + (e >> 1) * 8, n = 2 * t + (e & 1);
    float acc = c[e];
    for (unsigned k = 0; k < 16; ++k)
      acc += at((r % 8) * 4 + (k % 8) / 2, (r >= 8 ? 1 : 0) + (k >= 8 ? 2 : 0), k) *
             at(n * 4 + (k % 8) / 2, 4 + (k >= 8 ? 1 : 0), k);
    c[e] = acc;
  }
  tpc_emu_state->warps[w]->arrive_and_wait();
}
inline void tpc_mma_bf16(float* c, const u32* a, const u32* b) { tpc_emu_mma(c, a, b, false); }
inline void tpc_mma_f16(float* c, const u32* a, const u32* b) { tpc_emu_mma(c, a, b, true); }
inline u32 tpc_pack_bf16(float lo, float hi) { return (u32)tpc_f32_to_bf16(lo) | ((u32)tpc_f32_to_bf16(hi) << 16); }
inline u32 tpc_pack_f16(float lo, float hi) { return (u32)tpc_emu_f2h(lo) | ((u32)tpc_emu_f2h(hi) << 16); }
inline void tpc_ldsm_x4_trans(u32* r, const void* row) {
  unsigned w = tpc_emu_tid / 32, lane = tpc_emu_tid % 32, g = lane >> 2, t = lane & 3;
  tpc_emu_state->slots[tpc_emu_tid] = (unsigned long long)(uintptr_t)row;
  tpc_emu_state->warps[w]->arrive_and_wait();
  for (unsigned i = 0; i < 4; ++i) {
    const unsigned short* r0 = (const unsigned short*)(uintptr_t)tpc_emu_state->slots[w * 32 + i * 8 + 2 * t];
    const unsigned short* r1 = (const unsigned short*)(uintptr_t)tpc_emu_state->slots[w * 32 + i * 8 + 2 * t + 1];
    r[i] = (u32)r0[g] | ((u32)r1[g] << 16);
  }
  tpc_emu_state->warps[w]->arrive_and_wait();
}
inline void tpc_ldsm_x4(u32* r, const void* row) {
  unsigned w = tpc_emu_tid / 32, lane = tpc_emu_tid % 32, g = lane >> 2, t = lane & 3;
  tpc_emu_state->slots[tpc_emu_tid] = (unsigned long long)(uintptr_t)row;
  tpc_emu_state->warps[w]->arrive_and_wait();
  for (unsigned i = 0; i < 4; ++i) {
    const unsigned short* p = (const unsigned short*)(uintptr_t)tpc_emu_state->slots[w * 32 + i * 8 + g];
    r[i] = (u32)p[2 * t] | ((u32)p[2 * t + 1] << 16);
  }
  tpc_emu_state->warps[w]->arrive_and_wait();
}
// cp.async as a plain copy at issue and its waits as no-ops: a kernel that reads a tile before waiting is not
// caught here, one that overwrites a tile other threads still read is (the copy lands at once).
inline void tpc_cp_async16(void* dst, const void* src, bool full) {
  if (full) std::memcpy(dst, src, 16);
  else std::memset(dst, 0, 16);
}
inline void tpc_cp_async_commit() {}
inline void tpc_cp_async_wait_all() {}
inline void tpc_cp_async_wait_one() {}
template <int N> inline void tpc_cp_async_wait_n() {}
inline float tpc_ex2(float x) { return std::exp2(x); }
)SHIM";
}

// The kernel source rewritten for the shim: inline PTX conversions, tensor-core helpers and dynamic shared
// memory replaced.
inline std::string emulatedSource(std::string src, const std::string& entry) {
  auto replaceAll = [&](const std::string& from, const std::string& to) {
    for (size_t at = src.find(from); at != std::string::npos; at = src.find(from, at + to.size()))
      src.replace(at, from.size(), to);
  };
  replaceAll("  float f;\n  asm(\"{ cvt.f32.f16 %0, %1; }\" : \"=f\"(f) : \"h\"(h));\n  return f;",
             "  return tpc_emu_h2f(h);");
  replaceAll("  f16_t h;\n  asm(\"{ cvt.rn.f16.f32 %0, %1; }\" : \"=h\"(h) : \"f\"(f));\n  return h;",
             "  return tpc_emu_f2h(f);");
  replaceAll("extern __shared__ float smem[];", "float* smem = (float*)tpc_emu_smem;");
  replaceAll(cuda::tensorCorePrelude(), emulatedTensorCorePrelude());
  return std::string(cudaEmulatorShim()) + src + "\n#define TPC_EMU_ENTRY " + entry + "\n" + cudaEmulatorLauncher();
}

using EmuLaunch = void (*)(void**, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned);

// Compiles one kernel for the emulator into `dir` and returns its launcher.
inline Result<EmuLaunch> compileEmulated(const std::string& source, const std::string& entry, const std::string& dir,
                                         int serial) {
  std::string base = dir + "/" + entry + "_" + std::to_string(serial);
  {
    std::ofstream f(base + ".cpp");
    f << emulatedSource(source, entry);
  }
  std::string cmd = "c++ -std=c++20 -O1 -w -shared -fPIC -pthread -o " + base + ".so " + base + ".cpp 2> " + base + ".log";
  if (std::system(cmd.c_str()) != 0) return makeError("emulator: compiling ", base, ".cpp failed, see ", base, ".log");
  void* h = dlopen((base + ".so").c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!h) return makeError("emulator: dlopen ", base, ".so: ", dlerror());
  void* fn = dlsym(h, "tpc_emu_launch");
  if (!fn) return makeError("emulator: no tpc_emu_launch in ", base, ".so");
  return reinterpret_cast<EmuLaunch>(fn);
}

}  // namespace tpc::test
