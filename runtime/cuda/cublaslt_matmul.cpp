// CublasLtMatmul: descriptors and layouts per node, an algorithm per distinct GEMM (matmul_autotune.h).
#include "runtime/cuda/cublaslt_matmul.h"

#include <algorithm>
#include <cstring>

#include "runtime/cuda/cuda_libraries.h"
#include "runtime/cuda/matmul_autotune.h"

namespace tpc::cuda {

struct CublasLtMatmul::Plan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t la = nullptr, lb = nullptr, lc = nullptr;
  cublasLtMatmulAlgo_t algo{};
  std::string what;
  double flops = 0;  // of one call
  bool epilogue = false;  // a matmul_epilogue: run() sets its bias and aux pointers
  ~Plan() {
    auto lt = cublasLt();
    if (!lt.ok()) return;
    if (la) (*lt)->matrixLayoutDestroy(la);
    if (lb) (*lt)->matrixLayoutDestroy(lb);
    if (lc) (*lt)->matrixLayoutDestroy(lc);
    if (desc) (*lt)->matmulDescDestroy(desc);
  }
};

std::array<const Value*, 3> epilogueValues(const Node& n) {
  if (n.op() != OpKind::MatmulEpilogue) return {nullptr, nullptr, nullptr};
  const std::string& e = n.getStr("epilogue");
  const Value* bias = e == "bias" || e == "gelu_bias" ? n.operand(2)
                      : e == "dgelu_bgrad" || e == "bgrad_b" ? n.result(1)
                                                             : nullptr;
  const Value* aux = e == "gelu_bias" ? n.result(1) : e == "dgelu" || e == "dgelu_bgrad" ? n.operand(2) : nullptr;
  const Value* residual = e == "bias" && n.numOperands() == 4 ? n.operand(3) : nullptr;
  return {bias, aux, residual};
}

namespace {

Result<cudaDataType_t> dataType(DType t, const Node& n) {
  switch (t) {
    case DType::f32: return CUDA_R_32F;
    case DType::bf16: return CUDA_R_16BF;
    case DType::f16: return CUDA_R_16F;
    default: return makeError("cuda: matmul of ", dtypeName(t), " is not supported (f32, bf16 or f16)");
  }
}

#define LT_TRY(expr, what)                                                                  \
  do {                                                                                      \
    cublasStatus_t st_ = (expr);                                                            \
    if (st_ != CUBLAS_STATUS_SUCCESS) return makeError("cuBLASLt: ", what, " failed (status ", int(st_), ")"); \
  } while (0)

}  // namespace

Result<std::unique_ptr<CublasLtMatmul>> CublasLtMatmul::create(size_t workspaceBytes, int candidates,
                                                               CandidateTiming timing) {
  TPC_ASSIGN(const CublasLt* lt, cublasLt());
  std::unique_ptr<CublasLtMatmul> m(new CublasLtMatmul());
  cublasLtHandle_t h;
  LT_TRY(lt->create(&h), "cublasLtCreate");
  m->handle_ = h;
  m->workspace_ = workspaceBytes;
  m->candidates_ = candidates;
  m->timing_ = timing;
  return m;
}

CublasLtMatmul::~CublasLtMatmul() = default;

Result<int> CublasLtMatmul::plan(const Node& n, std::vector<std::array<int64_t, 3>>* calls) {
  TPC_ASSIGN(auto p, build(n, calls));
  plans_.push_back(std::move(p));
  return static_cast<int>(plans_.size()) - 1;
}

const std::string& CublasLtMatmul::what(int id) const { return plans_[static_cast<size_t>(id)]->what; }
double CublasLtMatmul::flops(int id) const { return plans_[static_cast<size_t>(id)]->flops; }

bool CublasLtMatmul::supports(const Node& n) {
  std::vector<std::array<int64_t, 3>> calls;
  return build(n, &calls).ok();
}

// cuBLASLt's epilogue for a matmul_epilogue. Its A is tpc's b (column-major C^T = B^T A^T), so tpc's
// bgrad_b (b summed over its rows) is BGRADA; bias vectors run along D's rows, tpc's columns N.
static Result<cublasLtEpilogue_t> epilogueOf(const std::string& e) {
  if (e == "bias") return CUBLASLT_EPILOGUE_BIAS;
  if (e == "gelu_bias") return CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
  if (e == "dgelu") return CUBLASLT_EPILOGUE_DGELU;
  if (e == "dgelu_bgrad") return CUBLASLT_EPILOGUE_DGELU_BGRAD;
  if (e == "bgrad_b") return CUBLASLT_EPILOGUE_BGRADA;
  return makeError("cuBLASLt: no epilogue for '", e, "'");
}

Result<std::unique_ptr<CublasLtMatmul::Plan>> CublasLtMatmul::build(const Node& n,
                                                                     std::vector<std::array<int64_t, 3>>* calls) {
  TPC_ASSIGN(const CublasLt* lt, cublasLt());
  const Value *A = n.operand(0), *B = n.operand(1), *C = n.result();
  bool ta = n.getBool("transpose_a"), tb = n.getBool("transpose_b");
  int64_t ra = A->type().rank(), rb = B->type().rank(), rc = C->type().rank();
  int64_t M = C->shape()[rc - 2], N = C->shape()[rc - 1];
  int64_t K = ta ? A->shape()[ra - 2] : A->shape()[ra - 1];
  // Batch dims: the output's, and each operand's broadcast strides over them (in matrices; 0: broadcast).
  Shape outBatch(C->shape().begin(), C->shape().end() - 2);
  auto batchStrides = [&](const Value* v) {
    Shape own(v->shape().begin(), v->shape().end() - 2);
    std::vector<int64_t> s(outBatch.size(), 0);
    int64_t acc = 1;
    for (size_t k = own.size(); k-- > 0;) {
      size_t o = outBatch.size() - own.size() + k;
      s[o] = own[k] == 1 ? 0 : acc;
      acc *= own[k];
    }
    return s;
  };
  std::vector<int64_t> sa = batchStrides(A), sb = batchStrides(B);
  int64_t batch = 1, aBatch = 1, bBatch = 1;
  for (int64_t d : outBatch) batch *= d;
  for (int64_t k = 0; k + 2 < ra; ++k) aBatch *= A->shape()[k];
  for (int64_t k = 0; k + 2 < rb; ++k) bBatch *= B->shape()[k];
  (void)rb;
  calls->assign(1, {0, 0, 0});
  int64_t strideA = aBatch == 1 ? 0 : M * K, strideB = bBatch == 1 ? 0 : K * N;
  bool simple = (aBatch == 1 || aBatch == batch) && (bBatch == 1 || bBatch == batch);
  if (!simple) {
    // The last batch dim as a strided batch; the outer dims as separate calls.
    size_t L = outBatch.size() - 1;
    batch = outBatch[L];
    strideA = sa[L] * M * K;
    strideB = sb[L] * K * N;
    calls->clear();
    int64_t outer = 1;
    for (size_t k = 0; k < L; ++k) outer *= outBatch[k];
    for (int64_t o = 0; o < outer; ++o) {
      int64_t rem = o, oa = 0, ob = 0;
      for (size_t k = L; k-- > 0;) {
        int64_t idx = rem % outBatch[k];
        rem /= outBatch[k];
        oa += idx * sa[k];
        ob += idx * sb[k];
      }
      calls->push_back({oa * M * K, ob * K * N, o * batch * M * N});
    }
    aBatch = strideA ? batch : 1;
    bBatch = strideB ? batch : 1;
  } else if (bBatch == 1 && aBatch == batch && !ta) {
    // b shared by every batch and a's rows contiguous: one [batch*M, K] x [K, N] product.
    M *= batch;
    batch = 1;
    aBatch = 1;
    strideA = 0;
  }
  TPC_ASSIGN(cudaDataType_t ta_, dataType(A->dtype(), n));
  TPC_ASSIGN(cudaDataType_t tb_, dataType(B->dtype(), n));
  TPC_ASSIGN(cudaDataType_t tc_, dataType(C->dtype(), n));

  auto p = std::make_unique<Plan>();
  p->what = cat("matmul ", A->type().str(), " x ", B->type().str(), ta ? " (a^T)" : "", tb ? " (b^T)" : "");
  LT_TRY(lt->matmulDescCreate(&p->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), "matmul descriptor");
  std::string epi;
  if (n.op() == OpKind::MatmulEpilogue) {
    epi = n.getStr("epilogue") + (n.numOperands() == 4 ? "+residual" : "");
    p->what += cat(" with epilogue ", epi);
    p->epilogue = true;
    if (batch != 1 || calls->size() != 1) return makeError("cuBLASLt: ", p->what, " is not one GEMM");
    TPC_ASSIGN(cublasLtEpilogue_t ep, epilogueOf(n.getStr("epilogue")));
    LT_TRY(lt->matmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &ep, sizeof ep), "EPILOGUE");
    if (epilogueValues(n)[1]) {  // the gelu input, [M, N] row-major: column-major N rows, ld N
      if (N % 8 != 0) return makeError("cuBLASLt: ", p->what, ": the aux matrix needs N divisible by 8");
      int64_t ld = N;
      LT_TRY(lt->matmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ld, sizeof ld), "EPILOGUE_AUX_LD");
    }
  }
  // Column-major: first operand is B (N x K after op), second is A (K x M after op).
  cublasOperation_t opFirst = tb ? CUBLAS_OP_T : CUBLAS_OP_N, opSecond = ta ? CUBLAS_OP_T : CUBLAS_OP_N;
  LT_TRY(lt->matmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &opFirst, sizeof opFirst), "TRANSA");
  LT_TRY(lt->matmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &opSecond, sizeof opSecond), "TRANSB");
  uint64_t bRows = tb ? K : N, bCols = tb ? N : K, aRows = ta ? M : K, aCols = ta ? K : M;
  LT_TRY(lt->matrixLayoutCreate(&p->la, tb_, bRows, bCols, static_cast<int64_t>(bRows)), "layout of b");
  LT_TRY(lt->matrixLayoutCreate(&p->lb, ta_, aRows, aCols, static_cast<int64_t>(aRows)), "layout of a");
  LT_TRY(lt->matrixLayoutCreate(&p->lc, tc_, N, M, N), "layout of c");
  if (batch > 1) {
    int32_t count = static_cast<int32_t>(batch);
    int64_t sB = strideB, sA = strideA, sC = M * N;
    for (auto [layout, stride] : {std::pair{p->la, sB}, std::pair{p->lb, sA}, std::pair{p->lc, sC}}) {
      LT_TRY(lt->matrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof count), "batch count");
      LT_TRY(lt->matrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof stride),
             "batch stride");
    }
  }
  std::string key = cat(int(ta_), ",", int(tb_), ",", int(tc_), ",", ta, tb, ",", M, ",", N, ",", K, ",", batch, ",",
                        aBatch, ",", bBatch, ",", epi);
  auto cached = algos_.find(key);
  if (cached != algos_.end()) {
    p->algo = cached->second;
  } else {
    // Scratch for timing candidates: each operand's extent over the batch, the epilogue's vectors and matrix.
    auto extent = [&](int64_t stride, int64_t matrix) { return stride * (batch - 1) + matrix; };
    GemmProblem g;
    g.handle = static_cast<cublasLtHandle_t>(handle_);
    g.desc = p->desc;
    g.la = p->la, g.lb = p->lb, g.lc = p->lc;
    g.bytesA = static_cast<size_t>(extent(strideA, M * K) * dtypeSize(A->dtype()));
    g.bytesB = static_cast<size_t>(extent(strideB, K * N) * dtypeSize(B->dtype()));
    g.bytesC = static_cast<size_t>(batch * M * N * dtypeSize(C->dtype()));
    if (p->epilogue) {
      auto [bias, aux, residual] = epilogueValues(n);
      g.biasBytes = bias ? static_cast<size_t>(std::max({M, N, K}) * 4) : 0;
      g.auxBytes = aux ? static_cast<size_t>(M * N * dtypeSize(C->dtype())) : 0;
      g.beta = residual ? 1.f : 0.f;
    }
    g.workspaceBytes = workspace_;
    g.what = p->what;
    TPC_ASSIGN(p->algo, chooseMatmulAlgo(*lt, g, key, candidates_, timing_));
    algos_[key] = p->algo;
  }
  p->flops = 2.0 * static_cast<double>(M) * static_cast<double>(N) * static_cast<double>(K) * static_cast<double>(batch);
  return p;
}

Status CublasLtMatmul::run(int id, const void* a, const void* b, void* c, const EpilogueBuffers& epi, void* workspace,
                           cudaStream_t stream) const {
  TPC_ASSIGN(const CublasLt* lt, cublasLt());
  const Plan& p = *plans_[id];
  if (p.epilogue) {  // the node's buffers (the heuristic ran with null pointers: any 256-byte aligned ones do)
    if (epi.bias)
      LT_TRY(lt->matmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &epi.bias, sizeof epi.bias), "BIAS_POINTER");
    if (epi.aux)
      LT_TRY(lt->matmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &epi.aux, sizeof epi.aux),
             "EPILOGUE_AUX_POINTER");
  }
  float alpha = 1.f, beta = epi.residual ? 1.f : 0.f;
  const void* src = epi.residual ? epi.residual : c;
  LT_TRY(lt->matmul(static_cast<cublasLtHandle_t>(handle_), p.desc, &alpha, b, p.la, a, p.lb, &beta, src, p.lc, c, p.lc,
                    &p.algo, workspace, workspace_, stream),
         p.what);
  return {};
}

}  // namespace tpc::cuda
