// Timing cuBLASLt's candidates and remembering the fastest (matmul_autotune.h).
#include "runtime/cuda/matmul_autotune.h"

#include <cstring>
#include <vector>

#include "runtime/cuda/candidate_timing.h"
#include "runtime/cuda/disk_cache.h"

namespace tpc::cuda {
namespace {

// The index of the fastest candidate, or 0 when timing cannot run.
size_t fastest(const CublasLt& lt, const GemmProblem& g, const std::vector<cublasLtMatmulHeuristicResult_t>& c,
               CandidateTiming timing) {
  DeviceScratch s(timing);
  // Sustained: a residual's C (beta 1) in a buffer of its own, as thousands of runs into D in place would pile up
  // there. Quick times 6 runs in place, as the step runs it.
  const bool ownC = g.beta != 0 && timing == CandidateTiming::Sustained;
  void *a = s.get(g.bytesA), *b = s.get(g.bytesB), *d = s.get(g.bytesC), *cin = ownC ? s.get(g.bytesC) : d,
       *bias = s.get(g.biasBytes), *aux = s.get(g.auxBytes), *ws = s.get(g.workspaceBytes);
  if (!s.ok()) return 0;
  if (bias) lt.matmulDescSetAttribute(g.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias);
  if (aux) lt.matmulDescSetAttribute(g.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux, sizeof aux);
  const float alpha = 1.f;
  return fastestCandidate(
      c.size(),
      [&](size_t i) {
        return lt.matmul(g.handle, g.desc, &alpha, b, g.la, a, g.lb, &g.beta, cin, g.lc, d, g.lc, &c[i].algo, ws,
                         g.workspaceBytes, nullptr) == CUBLAS_STATUS_SUCCESS;
      },
      timing);
}

}  // namespace

Result<cublasLtMatmulAlgo_t> chooseMatmulAlgo(const CublasLt& lt, const GemmProblem& g, const std::string& key,
                                              int candidates, CandidateTiming timing) {
  // cuBLASLt documents cublasLtMatmulAlgo_t as trivially serializable for the same library version.
  auto asAlgo = [](const std::string& bytes) {
    cublasLtMatmulAlgo_t algo;
    std::memcpy(&algo, bytes.data(), sizeof algo);
    return algo;
  };
  std::string fullKey, bytes;
  if (candidates > 1) {
    fullKey = cat(currentGpuKey(), " cublasLt ", lt.getVersion(), " | ", key, " | ", candidates, " candidates", candidateTimingKey(timing));
    if (readRememberedChoice(fullKey, "lt-algo", &bytes) && bytes.size() == sizeof(cublasLtMatmulAlgo_t)) return asAlgo(bytes);
  }
  cublasLtMatmulPreference_t pref;
  if (lt.preferenceCreate(&pref) != CUBLAS_STATUS_SUCCESS) return makeError("cuBLASLt: preference for ", g.what, " failed");
  uint64_t ws = g.workspaceBytes;
  lt.preferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws);
  std::vector<cublasLtMatmulHeuristicResult_t> results(static_cast<size_t>(std::max(candidates, 1)));
  int found = 0;
  cublasStatus_t st = lt.algoGetHeuristic(g.handle, g.desc, g.la, g.lb, g.lc, g.lc, pref,
                                          static_cast<int>(results.size()), results.data(), &found);
  lt.preferenceDestroy(pref);
  if (st != CUBLAS_STATUS_SUCCESS || found == 0)
    return makeError("cuBLASLt: no algorithm for ", g.what, " (status ", int(st), ")");
  results.resize(static_cast<size_t>(found));
  if (candidates <= 1) return results[0].algo;
  const cublasLtMatmulAlgo_t& algo = results[found > 1 ? fastest(lt, g, results, timing) : 0].algo;
  // Another thread may have timed it meanwhile: the first choice stays.
  const std::string kept = rememberChoice(fullKey, "lt-algo", std::string(reinterpret_cast<const char*>(&algo), sizeof algo));
  return kept.size() == sizeof algo ? asAlgo(kept) : algo;
}

}  // namespace tpc::cuda
