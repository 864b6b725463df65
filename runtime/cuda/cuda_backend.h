// The CUDA Backend: lowers each rank's step graph to a Program (static memory plan in one arena per rank,
// NVRTC kernels, cuBLASLt matmuls), captures the whole step once as a CUDA graph and replays it. Parameters
// and optimizer state live in their own device buffers, updated in place; the batch, lr and step are
// copied into fixed device buffers before each replay. Several rank graphs (a mesh) run as virtual ranks
// on the one GPU: their programs interleave on one stream, collectives are device kernels reading every
// rank's buffer. State and batch come in and go out unsharded, as with the CPU mesh backend.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "runtime/backend.h"

namespace tpc {

struct CudaOptions {
  uint64_t seed = 1234;  // dropout: Philox keyed by (seed, step, key, global element index), as on the CPU
  int device = 0;
  std::string cacheDir;  // NVRTC cubin cache; empty: $TPC_CACHE_DIR or ~/.cache/tpc/kernels
  bool verbose = true;   // print the memory plan and kernel counts at prepare()
  // Collectives between ranks: "nccl" (rank r on GPU r, an NCCL communicator per mesh-axis group),
  // "virtual" (all ranks on `device`, collectives as device kernels), "auto" (nccl when there are enough GPUs).
  std::string collectives = "auto";
  double collectiveTimeoutSeconds = 60;  // NCCL: a step waiting longer fails naming the rank and step
  // > 0: step `profileStep` (as the trainer counts, from 1) runs as a CUDA graph with an event between every
  // two launches, and its GPU time per op is printed (runtime/cuda/step_profile.h). The step's results are
  // the same as without profiling.
  int64_t profileStep = 0;
  // With profileStep: also write every launch of that step to this CSV file (step_profile.h), through a
  // temporary file renamed into place.
  std::string profileCsv;
  // The AdamW updates as multi-tensor kernels gated on non-finite steps (adamw_groups.h); false: one kernel
  // per adamw_update and a copy of the state they update kept aside each step (tests compare the two).
  bool multiTensorAdamW = true;
  // The casts of parameters and inputs between the same two dtypes (the bf16 copies of the f32 master
  // parameters) as one multi-tensor kernel where the first of them ran (cast_groups.h); false: a kernel per
  // cast. Bit-identical either way. The environment's TPC_MULTI_TENSOR_CASTS=0/1 overrides it (measuring).
  bool multiTensorCasts = true;
  // Fold bias adds, gelu, residual adds and bias gradients into the matmuls as cuBLASLt epilogues where
  // cuBLASLt has an algorithm for them (fold-matmul-epilogues); false keeps the unfused ops (comparisons).
  bool matmulEpilogues = true;
  // The epilogue kinds folded, comma-separated (bias, bias_residual, gelu_bias, dgelu, dgelu_bgrad, bgrad_b,
  // bgrad_a), or "all". bgrad_a, which cuBLASLt has no form of, folds only where our GEMM kernel runs it (ownGemm
  // below; dgelu_bgrad there too, whenever dgelu is listed). bias, bias_residual, gelu_bias and dgelu by default: on the H200 (gpt2, micro batch 16, bf16;
  // docs/performance.md) the forward kinds took the step from 41.7 to 38.0 ms and dgelu + bgrad_b to 36.5 ms,
  // but once the bias sums had the chunked column-reduce kernels, cuBLASLt's BGRADA GEMMs (360-620 TFLOP/s
  // against 600-730 plain) cost 1.0 ms more than those kernels (32.2 -> 31.1 ms without bgrad_b), and its
  // DGELU_BGRAD GEMMs 1.5 ms more than the unfused ops. The environment's TPC_MATMUL_EPILOGUES overrides it.
  std::string matmulEpilogueKinds = "bias,bias_residual,gelu_bias,dgelu,bgrad_a";
  // The matmul_epilogue kinds run on sm_90 by our GEMM kernel (TMA, wgmma; runtime/cuda/kernels/gemm_sm90.cpp)
  // where it applies, instead of cuBLASLt: "" (none), a list of "gelu_bias", "bias" (without a residual),
  // "bias_residual" (bias with one), "dgelu", "dgelu_bgrad" (dgelu with its bias gradient summed in the epilogue)
  // and "bgrad_a" (an input gradient d w^T with d's bias gradient summed from the a tiles; both folded only where
  // our kernel takes them), or "all", and ",multicast" to run it in clusters of two blocks that share each tile of
  // b by TMA multicast (",pre1": dgelu's pre copied one chunk ahead of its use instead of three, for measuring).
  // gelu_bias by default: 12-14% faster than cuBLASLt's GELU_AUX_BIAS alone on the H200 at gpt2's and
  // gpt2-medium's c_fc shapes, 0.5-0.8 ms less a gpt2-medium step (twenty-third session); bgrad_a by default: the
  // c_attn and c_fc bias sums no longer read dQKV and the DGELU output again, 1.1 ms less a gpt2-medium step and
  // 0.45 ms a gpt2 step on the H100 (twenty-fifth session). bias and bias_residual are off (bias: 6% faster alone,
  // within the noise in a step; bias_residual as fast as cuBLASLt or slower); dgelu is still slower than
  // cuBLASLt's DGELU (docs/performance.md). The environment's TPC_OWN_GEMM (0, 1 = all, or the list) overrides it.
  std::string ownGemm = "gelu_bias,bgrad_a";
  // Per distinct GEMM, time cuBLASLt's first 8 heuristic candidates on the GPU and keep the fastest, remembered
  // in the kernel cache folder so later runs use the same algorithm (matmul_autotune.h); false: the
  // heuristic's first choice. cuDNN attention's engine configs likewise (cudnn_attention.h). The environment's
  // TPC_MATMUL_AUTOTUNE=0|1 overrides it (measuring).
  bool matmulAutotune = true;
  // Several ranks: the captured step runs the collectives on a communication stream of their own (per GPU),
  // so that compute that does not depend on one overlaps it (comm_stream_schedule.h); false: one stream.
  // Results are bit-identical either way. The profiled step and TPC_CUDA_DEBUG run on one stream.
  bool collectiveStream = true;
  // attention and its gradient (16-bit, no dropout, Tq == Tk): "cudnn" through cuDNN's fused flash attention
  // (cudnn_attention.h; an error where cuDNN is missing or has no engine), "tpc" through our tensor-core
  // kernels, "auto" cuDNN where it loads and plans, else ours. The environment's TPC_ATTENTION overrides it.
  std::string attention = "auto";
  // One process per mesh rank (`mpirun -np N tpc run --backend cuda`): the one rank graph given is mesh rank
  // `processRank`, run on GPU `device`. Its NCCL communicators come from ncclCommInitRank, the group leaders'
  // ids handed round by `allGatherWorld` (every process of the job, one per mesh rank and numbered as the mesh
  // ranks, contributes `bytes` bytes; out receives them in rank order), which readState() also uses to gather
  // the other ranks' blocks: every process must prepare, step and read the same state tensors in the same
  // order. -1: every rank of the mesh in this process.
  int64_t processRank = -1;
  std::function<Status(const void* in, int64_t bytes, void* out)> allGatherWorld;
  // The backend whose parameters this one reads (tpc run's evaluator: the training backend, which must outlive
  // this one). A parameter that no output of this backend's step replaces, of which `stateSource` holds a rank's
  // block on the same GPU in the same dtype and layout (Backend::deviceState), is read from that buffer: this
  // backend holds no memory for it and copyStateFrom(stateSource) has nothing to copy. Such a parameter cannot
  // be written here (writeState, copyStateFrom from another backend). Where stateSource is a CUDA backend whose
  // same rank's activations arena is at least as large as ours, our steps use that arena too (a step's values
  // live within the step), so this backend's steps must never run while stateSource's run: tpc run evaluates
  // between training steps. nullptr: every parameter and arena is this backend's own.
  const Backend* stateSource = nullptr;
};

// The captured step of GPU 0, for tests: its launches, those on the communication stream, the collectives,
// the forks and joins between the streams, the compute launches issued while a collective may run, and the
// CUDA graph's nodes and dependency edges (one stream: a chain, edges = nodes - 1).
struct CudaStepGraphInfo {
  int64_t launches = 0, commLaunches = 0, collectives = 0, forks = 0, joins = 0, overlapped = 0;
  int64_t graphNodes = 0, graphEdges = 0;
  int64_t keptCopies = 0;  // 16-bit parameter copies the AdamW kernels keep (adamw_groups.h), over all ranks
  int64_t gemmKernels = 0;  // matmul launches of our own GEMM kernels (gemm_sm90.cpp) instead of cuBLASLt
  int64_t clusteredGemmKernels = 0;  // ... of those, launched in clusters of blocks (multicast), and their blocks
  int64_t clusteredGemmBlocks = 0;
  int64_t residualLayerNorms = 0;  // layer_norms that add the residual stream (fold-layer-norm-residual), all ranks
  // Ranks whose activations arena, and parameter blocks (over all ranks), are CudaOptions::stateSource's.
  int64_t borrowedArenas = 0, borrowedParams = 0;
};
// nullopt for a backend that is not a prepared CUDA backend (or one in TPC_CUDA_DEBUG mode: no graph).
std::optional<CudaStepGraphInfo> cudaStepGraphInfo(const Backend& backend);

// rankGraphs: one graph per rank of the graphs' mesh (empty: the single-rank graph given to prepare()).
std::unique_ptr<Backend> createCudaBackend(std::vector<std::unique_ptr<Graph>> rankGraphs, CudaOptions options);

}  // namespace tpc
