// What a CUDA lowering of one IR node produces: kernels as complete CUDA C sources for NVRTC, each with
// its entry point, launch geometry and the meaning of every kernel parameter. Lowerings are pure functions
// of the node and its types (no CUDA calls), so they run, and every generated source is compiled by NVRTC,
// on machines without a GPU (CI). The executor (runtime/cuda) binds the arguments to device addresses.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ir/graph.h"
#include "ir/status.h"

namespace tpc::cuda {

enum class ArgKind {
  Operand,    // pointer to the node's operand `index` (const T*)
  Result,     // pointer to the node's result `index` (T*)
  Workspace,  // pointer `offset` bytes into this node's workspace (zeroed before the first kernel when
              // NodeLowering::zeroWorkspace), for scratch shared by the node's kernels
  Int64,      // long long by value (`i`)
  Float,      // float by value (`f`)
  Seed,       // unsigned long long: the run's dropout seed
  StepPtr,    // const long long*: device word holding the current step (changes per CUDA-graph replay)
  HoldPtr,    // const int*: device word, nonzero while the step must leave the state alone (checking mode)
  FreshPtr,   // const int*: device word, nonzero while the AdamW kernels' 16-bit copies of the parameters hold
              // their casts (adamw_groups.h), so the cast group skips them
  Table,      // const unsigned long long*: a device array, written once at prepare, of the addresses of
              // KernelSpec::tables[index] (Operand and Result entries): a multi-tensor kernel's tensors
  TensorMap,  // a 128-byte TMA descriptor by value (const __grid_constant__), KernelSpec::maps[index]
};

// A 2-D TMA descriptor of a node's operand or result (cuTensorMapEncodeTiled, bound to its address): the
// value seen as row-major [rows, cols] 16-bit elements, tiles of [boxRows, boxCols], 128-byte swizzle.
struct TensorMapSpec {
  bool operand = true;  // else a result
  int64_t index = 0;
  int64_t rows = 0, cols = 0;
  uint32_t boxRows = 0, boxCols = 0;
};

struct KernelArg {
  ArgKind kind;
  int64_t index = 0;  // Operand/Result: which; Workspace: byte offset; Table: which of KernelSpec::tables
  int64_t i = 0;
  double f = 0;
};

struct Dim3 {
  uint32_t x = 1, y = 1, z = 1;
};

struct KernelSpec {
  std::string entry;   // extern "C" __global__ function name in `source`
  std::string source;  // one whole translation unit (NVRTC: no host headers; define what you use)
  Dim3 grid, block;
  uint32_t sharedBytes = 0;  // dynamic shared memory
  std::vector<KernelArg> args;
  std::vector<std::vector<KernelArg>> tables;  // the entries of the Table arguments
  std::vector<TensorMapSpec> maps;             // the TensorMap arguments
  bool archSpecific = false;  // compiled for sm_XXa (wgmma, setmaxnreg): runs on that architecture only
  // > 0: the registers a thread the kernel must get from ptxas (checked at load; a setmaxnreg split that does
  // not add up would wait forever for registers).
  int requiredRegisters = 0;
  // > 1: the kernel's compile-time cluster width (__cluster_dims__); grid.x is a multiple of it, and the loader
  // lowers it to the clusters that fit on the GPU at once (a persistent kernel's grid must be one wave).
  uint32_t clusterX = 1;
};

struct NodeLowering {
  std::vector<KernelSpec> kernels;  // launched in order on the compute stream
  int64_t workspaceBytes = 0;
  bool zeroWorkspace = false;
};

struct LoweringContext {
  int smMajor = 9, smMinor = 0;  // target architecture
  int64_t maxSharedBytes = 227 * 1024;
  int numSMs = 132;                   // persistent kernels size their grid by these two (H200 defaults)
  int64_t sharedPerSM = 228 * 1024;
  // Memory-bound kernel variants, on by default; TPC_MEMBW_OFF (cuda_backend.cpp) switches them off to compare.
  bool columnReduce = true;       // reduce_sum/mean/max over leading dims: the chunked 16-byte kernel (reduction.cpp)
  bool columnReduceWave = true;   // ... in one wave of blocks, 8 rows loaded at a time a thread (else 16 waves, 1 row)
  bool vectorElementwise = true;  // a lone elementwise node through the fused kernel's 16-byte path
  bool xentOnePass = true;        // cross_entropy(_with)_grad: the row-resident pipelined kernel (loss_resident.cpp)
  bool layerNormGradBlocks = true;  // layer_norm_grad (warp rows): dgamma/dbeta partials per block, next row prefetched
  // ... its dgamma/dbeta sums in registers where a lane holds at most this many columns of 16-bit rows (half for
  // f32), else in shared memory; its dx sums (sum_dx) likewise up to layerNormGradRegSumColumns (0: never). H200,
  // [16384, 768] with the residual and sum_dx: 0.047 ms with dgamma/dbeta in registers and the dx sums in shared
  // memory, 0.051 all in registers, 0.053 all in shared memory; at 1024 columns registers spill (0.080 vs 0.059).
  int layerNormGradRegColumns = 24, layerNormGradRegSumColumns = 0;
  // ... gamma (read twice a row) from shared memory, loaded once a block, where that is faster (normalization.cpp).
  bool layerNormGradGammaShared = true;
  // ... rows of 16-byte pieces: x, dy (and the residual) copied by cp.async into a ring of this many rows a warp in
  // shared memory (0: the next row's x and dy prefetched into registers; TPC_LN_GRAD_STAGES sets it).
  int layerNormGradStages = 0;
  // ... at 32 columns a lane of 16-bit rows (1024 wide): a ring of 2 rows and every sum in registers, whatever the
  // three settings above say (TPC_MEMBW_OFF=lnwide, or setting TPC_LN_GRAD_STAGES or TPC_LN_GRAD_REGS, turns it off).
  bool layerNormGradWide = true;
  bool embeddingGradSegments = true;  // embedding_grad: ranks within an id's segment, a warp per table row (gather.cpp)
  // matmul_epilogue gelu_bias, bias (without a residual), bias_residual (bias with one) and dgelu on sm_90 through
  // our GEMM kernel (gemm_sm90.cpp) where it applies, else cuBLASLt's GELU_AUX_BIAS, BIAS (beta 1 on the residual)
  // and DGELU (CudaOptions::ownGemm, TPC_OWN_GEMM).
  bool ownGeluGemm = false, ownBiasGemm = false, ownBiasResidualGemm = false, ownDgeluGemm = false;
  bool ownDgeluBgradGemm = false;  // ... and dgelu_bgrad (g and its column sums; folded only where ours runs it)
  bool ownBgradAGemm = false;      // ... and bgrad_a (d w^T and d's column sums; folded only where ours runs it)
  bool ownGemmMulticast = false;  // ... in clusters of two blocks sharing b's tiles by TMA multicast
  int ownGemmPreAhead = 3;        // ... dgelu's pre copied 3 chunks ahead of its use, or 1 (TPC_OWN_GEMM's pre1)
};

}  // namespace tpc::cuda
