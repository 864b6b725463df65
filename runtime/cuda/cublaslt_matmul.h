// Matmul nodes through cuBLASLt: row-major a[..., M, K] x b[..., K, N] (transpose flags, batch dims equal
// or b 2-D) as the column-major product C^T = B^T A^T; fp32, bf16 or f16 inputs with fp32 accumulation.
// The algorithm is the heuristic's first choice, picked once per shape and kept for the process.
#pragma once

#include <array>
#include <map>
#include <vector>
#include <memory>
#include <string>

#include <cuda_runtime_api.h>

#include "ir/graph.h"
#include "ir/status.h"

namespace tpc::cuda {

class CublasLtMatmul {
 public:
  static Result<std::unique_ptr<CublasLtMatmul>> create(size_t workspaceBytes);
  ~CublasLtMatmul();
  // Plans node `n` (a matmul). Batch dims that broadcast other than "b is 2-D" (e.g. [4,1] x [3]) become
  // one strided-batched call per index of the outer batch dims: `calls` gets their element offsets into
  // a, b and c (one {0, 0, 0} entry in the usual case). Returns a plan id for run().
  Result<int> plan(const Node& n, std::vector<std::array<int64_t, 3>>* calls);
  // Enqueues plan `id` on `stream` (capturable: no allocation, fixed workspace).
  Status run(int id, const void* a, const void* b, void* c, void* workspace, cudaStream_t stream) const;
  size_t workspaceBytes() const { return workspace_; }
  int distinctShapes() const { return static_cast<int>(algos_.size()); }

 private:
  struct Plan;
  CublasLtMatmul() = default;
  void* handle_ = nullptr;
  size_t workspace_ = 0;
  std::vector<std::unique_ptr<Plan>> plans_;
  std::map<std::string, int> algos_;  // shape key -> plan id holding its algorithm
};

}  // namespace tpc::cuda
