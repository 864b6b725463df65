// Matmul nodes through cuBLASLt: row-major a[..., M, K] x b[..., K, N] (transpose flags, batch dims equal
// or b 2-D) as the column-major product C^T = B^T A^T; fp32, bf16 or f16 inputs with fp32 accumulation.
// matmul_epilogue nodes (ops.def) are one such GEMM with cuBLASLt's epilogue (bias, GELU, their gradients;
// a residual as C with beta 1). The algorithm is picked once per distinct GEMM: the heuristic's first choice,
// or the fastest of its first candidates timed on the GPU (matmul_autotune.h).
#pragma once

#include <array>
#include <map>
#include <vector>
#include <memory>
#include <string>

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include "ir/graph.h"
#include "ir/status.h"
#include "runtime/cuda/candidate_timing.h"

namespace tpc::cuda {

// The buffers of a matmul_epilogue besides a, b and c: the bias (or the bias gradient it writes), the aux
// matrix (the gelu input it writes or reads) and the residual (C, added with beta 1). Null: none.
struct EpilogueBuffers {
  const void* bias = nullptr;
  const void* aux = nullptr;
  const void* residual = nullptr;
};
// The node's values in those roles (null where it has none), for the backend to give their addresses.
std::array<const Value*, 3> epilogueValues(const Node& n);

class CublasLtMatmul {
 public:
  // candidates > 1: time that many of the heuristic's algorithms per GEMM, as `timing` says, and keep the fastest.
  static Result<std::unique_ptr<CublasLtMatmul>> create(size_t workspaceBytes, int candidates = 1,
                                                        CandidateTiming timing = CandidateTiming::Quick);
  ~CublasLtMatmul();
  // Plans node `n` (a matmul). Batch dims that broadcast other than "b is 2-D" (e.g. [4,1] x [3]) become
  // one strided-batched call per index of the outer batch dims: `calls` gets their element offsets into
  // a, b and c (one {0, 0, 0} entry in the usual case). Returns a plan id for run().
  Result<int> plan(const Node& n, std::vector<std::array<int64_t, 3>>* calls);
  // Whether plan(n) would succeed: a matmul_epilogue that cuBLASLt has an algorithm for (else the graph
  // keeps the unfused ops).
  bool supports(const Node& n);
  // Enqueues plan `id` on `stream` (capturable: no allocation, fixed workspace).
  Status run(int id, const void* a, const void* b, void* c, const EpilogueBuffers& epi, void* workspace,
             cudaStream_t stream) const;
  size_t workspaceBytes() const { return workspace_; }
  // Plan `id`'s description ("matmul bf16[...] x bf16[...] ...") and FLOPs per call (2 M N K per batch).
  const std::string& what(int id) const;
  double flops(int id) const;
  int distinctShapes() const { return static_cast<int>(algos_.size()); }

 private:
  struct Plan;
  CublasLtMatmul() = default;
  Result<std::unique_ptr<Plan>> build(const Node& n, std::vector<std::array<int64_t, 3>>* calls);
  void* handle_ = nullptr;
  size_t workspace_ = 0;
  int candidates_ = 1;
  CandidateTiming timing_ = CandidateTiming::Quick;
  std::vector<std::unique_ptr<Plan>> plans_;
  std::map<std::string, cublasLtMatmulAlgo_t> algos_;  // shape and epilogue key -> its algorithm
};

}  // namespace tpc::cuda
