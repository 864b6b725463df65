// cuBLASLt's heuristic ranks algorithms by a model, not a clock. For each distinct GEMM (types, shape,
// transposes, epilogue) the backend can time the heuristic's first candidates on scratch buffers and keep
// the fastest. The choice is remembered in the cache folder (disk_cache.h) under a key of the GPU,
// cuBLASLt's version and the GEMM, and by every backend of this process: later runs use the same
// algorithm, so the same bits, run after run on one machine (algorithms differ in their split-K sums).
#pragma once

#include <cublasLt.h>

#include <string>

#include "ir/status.h"
#include "runtime/cuda/candidate_timing.h"
#include "runtime/cuda/cuda_libraries.h"

namespace tpc::cuda {

// One GEMM as cuBLASLt runs it, and the scratch bytes a timed run needs.
struct GemmProblem {
  cublasLtHandle_t handle = nullptr;
  cublasLtMatmulDesc_t desc = nullptr;  // its bias and aux pointers are set to scratch while timing
  cublasLtMatrixLayout_t la = nullptr, lb = nullptr, lc = nullptr;
  size_t bytesA = 0, bytesB = 0, bytesC = 0, biasBytes = 0, auxBytes = 0, workspaceBytes = 0;
  float beta = 0;    // 1 when C is a residual added in place
  std::string what;  // for errors: "matmul bf16[...] x ..."
};

// The algorithm for the GEMM `key`: remembered (this process, then the cache folder), else the fastest of up
// to `candidates` heuristic results timed on the GPU as `timing` says, remembered under a key of that timing
// (the first result when only one comes back or the scratch memory cannot be had; candidates 1: the heuristic's
// choice, untimed and not remembered). Errors: cuBLASLt has no algorithm for it.
Result<cublasLtMatmulAlgo_t> chooseMatmulAlgo(const CublasLt& lt, const GemmProblem& g, const std::string& key,
                                              int candidates, CandidateTiming timing = CandidateTiming::Quick);

}  // namespace tpc::cuda
