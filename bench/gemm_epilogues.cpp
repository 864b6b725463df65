// tpc_gemm_bench: the GPT MLP's fused GEMMs (gelu_bias forward, dgelu and dgelu_bgrad backward; bias, and the plain
// GEMM with no epilogue, at the same shape, for what an epilogue costs; and bias_residual, y = x w + bias + r, the
// epilogue of the attention projection's and c_proj's forward GEMMs, at the projection's [rows, D] x [D, D]) timed
// on the GPU through our sm_90 kernel (runtime/cuda/kernels/gemm_sm90.cpp, TPC_OWN_GEMM) and through cuBLASLt's
// epilogues, with b given as [K, N] and as [N, K] (transpose_b: the layout the GPT's dgelu GEMM has), so that a
// slow kernel is pinned to the epilogue or to b's layout. Each setting is one graph of `copies` independent
// GEMMs (their own inputs: nothing is shared or cached between them) run once and then profiled launch by
// launch (CudaOptions::profileStep); the table gives the mean GPU time per GEMM and its TFLOP/s.
//
//   tpc_gemm_bench [--rows 16384] [--hidden 1024] [--copies 4] [--kinds gelu_bias,dgelu,dgelu_bgrad,bias,bias_residual,plain]
//                  [--multicast] [--pre1]
// bias, bias_residual and plain take a shape suffix: @fc1 ([D, 4D], c_fc's; bias's and plain's default), @proj ([D, D],
// the attention projection's; bias_residual's default) or @fc2 ([4D, D], c_proj's): e.g. bias@fc2,bias_residual@fc2
// is what the residual (cuBLASLt's C with beta 1) costs c_proj's GEMM.
// --multicast adds ours in clusters of two blocks (TPC_OWN_GEMM's multicast); --pre1 adds dgelu with pre copied one
// chunk ahead of its use instead of three (TPC_OWN_GEMM's pre1).
//
// gpt2-medium's MLP at micro-batch 16, seq 1024: --rows 16384 --hidden 1024 (the defaults); gpt2: --hidden 768.
#include <cuda_runtime.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "ir/graph.h"
#include "runtime/cuda/cuda_backend.h"
#include "runtime/host_tensor.h"

namespace tpc {
namespace {

struct Args {
  int64_t rows = 16384, hidden = 1024, copies = 4;
  std::vector<std::string> kinds = {"gelu_bias", "dgelu", "dgelu_bgrad"};
  bool multicast = false, pre1 = false;
};

[[noreturn]] void fail(const std::string& what) {
  std::fprintf(stderr, "tpc_gemm_bench: error: %s\n", what.c_str());
  std::exit(1);
}

[[noreturn]] void usage(const std::string& why) {
  if (!why.empty()) fail(why + " (tpc_gemm_bench --help lists the options)");
  std::printf("usage: tpc_gemm_bench [--rows R] [--hidden D] [--copies C] "
              "[--kinds gelu_bias,dgelu,dgelu_bgrad,bias,bias_residual,plain] [--multicast] [--pre1]\n  R: a multiple of 256 "
              "(default 16384); D: a multiple of 64 (default 1024; the MLP is D -> 4D); C: GEMMs per timed graph (default 4)\n"
              "  kinds: default gelu_bias,dgelu,dgelu_bgrad; bias (y = x w + bias) and plain (y = x w, cuBLASLt only) at "
              "gelu_bias's shape; bias_residual (y = x w + bias + r) at the attention projection's, w [D, D]; a suffix @fc1, "
              "@proj or @fc2 on bias, bias_residual or plain sets w to [D, 4D], [D, D] or [4D, D]\n");
  std::exit(0);
}

int64_t positive(const char* flag, const char* v) {
  char* end = nullptr;
  long long x = std::strtoll(v, &end, 10);
  if (!*v || *end || x <= 0) usage(std::string(flag) + " must be a positive integer, got '" + v + "'");
  return x;
}

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    std::string f = argv[i];
    if (f == "--help" || f == "-h") usage("");
    if (f == "--multicast" || f == "--pre1") {
      (f == "--multicast" ? a.multicast : a.pre1) = true;
      continue;
    }
    if (i + 1 >= argc) usage(f + " needs a value (or is not an option)");
    const char* v = argv[++i];
    if (f == "--rows") a.rows = positive("--rows", v);
    else if (f == "--hidden") a.hidden = positive("--hidden", v);
    else if (f == "--copies") a.copies = positive("--copies", v);
    else if (f == "--kinds") {
      a.kinds.clear();
      std::stringstream ss(v);
      for (std::string k; std::getline(ss, k, ',');) {
        const std::string base = k.substr(0, k.find('@')), shape = k.find('@') == std::string::npos ? "" : k.substr(k.find('@'));
        if (base != "gelu_bias" && base != "dgelu" && base != "dgelu_bgrad" && base != "bias" && base != "bias_residual" &&
            base != "plain")
          usage("--kinds: '" + k + "' is not gelu_bias, dgelu, dgelu_bgrad, bias, bias_residual or plain");
        if (!shape.empty() && ((base != "bias" && base != "bias_residual" && base != "plain") ||
                               (shape != "@fc1" && shape != "@proj" && shape != "@fc2")))
          usage("--kinds: '" + k + "': only bias, bias_residual and plain take a shape, @fc1, @proj or @fc2");
        a.kinds.push_back(k);
      }
      if (a.kinds.empty()) usage("--kinds is empty");
    } else usage("unknown option '" + f + "'");
  }
  // Bounds that keep a setting's operands (copies x (rows x 5D + 4D^2) bf16, on the host and the GPU) in memory.
  if (a.rows > (1 << 20) || a.hidden > 16384 || a.copies > 64) usage("--rows <= 1048576, --hidden <= 16384 and --copies <= 64");
  if (a.rows % 256) usage("--rows must be a multiple of 256");
  if (a.hidden % 64) usage("--hidden must be a multiple of 64");
  return a;
}

Value* op(Graph& g, OpKind k, std::vector<Value*> operands, AttrDict attrs = {}) {
  auto n = g.create(k, std::move(operands), std::move(attrs));
  if (!n.ok()) fail(n.error());
  return (*n)->result();
}

// A kind's GEMM is [rows, K] x [K, N]: K = D, N = 4D (gelu_bias's shape) but for bias_residual, at the attention
// projection's N = D; a shape suffix sets them (@fc1 D x 4D, @proj D x D, @fc2 4D x D).
std::string baseKind(const std::string& kind) { return kind.substr(0, kind.find('@')); }
std::string shapeOf(const std::string& kind) {
  if (kind.find('@') != std::string::npos) return kind.substr(kind.find('@') + 1);
  return kind == "bias_residual" ? "proj" : "fc1";
}
int64_t gemmK(const Args& a, const std::string& kind) { return shapeOf(kind) == "fc2" ? 4 * a.hidden : a.hidden; }
int64_t gemmN(const Args& a, const std::string& kind) { return shapeOf(kind) == "fc1" ? 4 * a.hidden : a.hidden; }

// `copies` GEMMs of one kind: gelu_bias y = gelu(x w + bias) with pre; bias y = x w + bias; bias_residual
// y = r + (x w + bias); plain y = x w; dgelu g = (dy w) * gelu'(pre) (w: the MLP's second weight, so K = D, N = 4D),
// with db = g's column sums for dgelu_bgrad. bT: w given as [N, K].
std::unique_ptr<Graph> mlpGemms(const Args& a, const std::string& shapedKind, bool bT) {
  const int64_t K = gemmK(a, shapedKind), N = gemmN(a, shapedKind);
  const std::string kind = baseKind(shapedKind);
  auto g = std::make_unique<Graph>(kind);
  auto T = [](Shape s) { return TensorType(DType::bf16, std::move(s)); };
  AttrDict tb, rowsAxes;
  if (bT) tb.set("transpose_b", true);
  rowsAxes.set("axes", std::vector<int64_t>{0, 1});
  for (int64_t c = 0; c < a.copies; ++c) {
    std::string s = std::to_string(c);
    Value* x = g->addInput("x" + s, T({a.rows / 256, 256, K}));
    Value* w = g->addInput("w" + s, T(bT ? Shape{N, K} : Shape{K, N}));
    Value* mm = op(*g, OpKind::Matmul, {x, w}, tb);
    if (kind == "gelu_bias") {
      Value* pre = op(*g, OpKind::Add, {mm, g->addInput("bias" + s, T({N}))});
      g->addOutput(op(*g, OpKind::Gelu, {pre}), "y" + s);
      g->addOutput(pre, "pre" + s);
    } else if (kind == "bias") {
      g->addOutput(op(*g, OpKind::Add, {mm, g->addInput("bias" + s, T({N}))}), "y" + s);
    } else if (kind == "bias_residual") {
      // The residual add as the GPT writes it, add(r, add(x w, bias)): the fold takes the bias add's sole reader
      // (either operand order) into matmul_epilogue {bias} with r as its fourth operand (C with beta 1 in cuBLASLt).
      Value* biased = op(*g, OpKind::Add, {mm, g->addInput("bias" + s, T({N}))});
      g->addOutput(op(*g, OpKind::Add, {g->addInput("r" + s, T({a.rows / 256, 256, N})), biased}), "y" + s);
    } else if (kind == "plain") {
      g->addOutput(mm, "y" + s);
    } else {
      Value* d = op(*g, OpKind::GeluGrad, {mm, g->addInput("pre" + s, T({a.rows / 256, 256, N}))});
      g->addOutput(d, "g" + s);
      if (kind == "dgelu_bgrad") g->addOutput(op(*g, OpKind::ReduceSum, {d}, rowsAxes), "db" + s);
    }
  }
  return g;
}

// bf16 values uniform in [-span, span], from a fixed LCG (fast for the 16M-element operands).
HostTensor uniformBf16(const Shape& shape, double span, uint64_t seed) {
  HostTensor t(TensorType(DType::bf16, shape));
  uint16_t* p = t.data<uint16_t>();
  uint64_t s = seed * 6364136223846793005ull + 1442695040888963407ull;
  for (int64_t i = 0; i < t.numel(); ++i) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    double u = static_cast<double>(s >> 11) * 0x1.0p-53;
    p[i] = floatToBf16(static_cast<float>((2 * u - 1) * span));
  }
  return t;
}

struct Timing {
  double msPerGemm = 0;
  int64_t launches = 0, ownKernels = 0;
};

// One step to warm up (NVRTC, cuBLASLt's heuristics), the second profiled into a CSV; its launches summed.
Timing timeGraph(const Graph& g, const TensorMap& in, const Args& a, const std::string& ownGemm) {
  const std::string csv = "/tmp/tpc_gemm_bench." + std::to_string(getpid()) + ".csv";
  CudaOptions o;
  o.verbose = false;
  o.ownGemm = ownGemm;
  o.matmulEpilogueKinds = "all";
  o.profileStep = 2;
  o.profileCsv = csv;
  auto backend = createCudaBackend({}, o);
  if (Status st = backend->prepare(g, {}); !st.ok()) fail(st.error());
  std::fflush(stdout);
  int saved = dup(1), devnull = open("/dev/null", O_WRONLY);  // the backend prints the profile table
  dup2(devnull, 1);
  auto r1 = backend->step(in, 1);
  auto r2 = r1.ok() ? backend->step(in, 2) : r1;
  std::fflush(stdout);
  dup2(saved, 1);
  close(saved);
  close(devnull);
  if (!r2.ok()) fail(r2.error());
  Timing t;
  std::ifstream f(csv);
  std::string line;
  std::getline(f, line);  // gpu,launch,op,ms,tflops,what,gemm
  double total = 0;
  while (std::getline(f, line)) {
    std::stringstream ss(line);
    std::string field;
    for (int i = 0; i < 4 && std::getline(ss, field, ','); ++i) {}
    total += std::atof(field.c_str());
    ++t.launches;
    t.ownKernels += line.find("gemm_") != std::string::npos && line.find("_kernel") != std::string::npos;
  }
  std::remove(csv.c_str());
  if (t.launches == 0) fail("the profiled step wrote no launches to " + csv);
  t.msPerGemm = total / static_cast<double>(a.copies);
  return t;
}

int run(int argc, char** argv) {
  Args a = parse(argc, argv);
  unsetenv("TPC_OWN_GEMM");  // it would override CudaOptions::ownGemm
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, 0) != cudaSuccess) fail("no CUDA GPU");
  const int64_t K = a.hidden;
  auto flops = [&](int64_t k, int64_t N) { return 2.0 * static_cast<double>(a.rows) * k * N; };
  std::printf("%s (sm_%d%d); [%lld, %lld] x [%lld, %lld], %lld GEMMs a graph, %.1f GFLOP each", prop.name, prop.major,
              prop.minor, static_cast<long long>(a.rows), static_cast<long long>(K), static_cast<long long>(K),
              static_cast<long long>(4 * K), static_cast<long long>(a.copies), flops(K, 4 * K) * 1e-9);
  for (const std::string& kind : a.kinds)  // the kinds at another shape
    if (shapeOf(kind) != "fc1")
      std::printf(" (%s: w [%lld, %lld], %.1f GFLOP)", kind.c_str(), static_cast<long long>(gemmK(a, kind)),
                  static_cast<long long>(gemmN(a, kind)), flops(gemmK(a, kind), gemmN(a, kind)) * 1e-9);
  std::printf("\n");
  std::printf("%-18s %-8s %-22s %8s %6s %10s %9s\n", "kind", "b", "engine", "launches", "ours", "ms/GEMM", "TFLOP/s");
  for (const std::string& kind : a.kinds)
    for (bool bT : {false, true}) {
      const double gemmFlops = flops(gemmK(a, kind), gemmN(a, kind));
      auto g = mlpGemms(a, kind, bT);
      TensorMap in;
      uint64_t seed = 1;
      for (const Value* v : g->inputs()) {
        char c = v->name()[0];
        double span = c == 'w' ? 2.0 / std::sqrt(static_cast<double>(gemmK(a, kind))) : c == 'p' ? 5.0 : 1.0;
        in[v->name()] = uniformBf16(v->shape(), span, seed++);
      }
      const std::string base = baseKind(kind);
      std::vector<std::pair<std::string, std::string>> engines = {{"cuBLASLt", ""}};
      if (base != "plain") engines.push_back({"ours", base});
      if (a.multicast && base != "plain") engines.push_back({"ours,multicast", base + ",multicast"});
      if (a.pre1 && base.rfind("dgelu", 0) == 0) engines.push_back({"ours,pre1", base + ",pre1"});
      for (const auto& [name, own] : engines) {
        Timing t = timeGraph(*g, in, a, own);
        std::printf("%-18s %-8s %-22s %8lld %6lld %10.4f %9.1f\n", kind.c_str(), bT ? "[N,K]" : "[K,N]", name.c_str(),
                    static_cast<long long>(t.launches), static_cast<long long>(t.ownKernels), t.msPerGemm,
                    gemmFlops / (t.msPerGemm * 1e-3) * 1e-12);
        std::fflush(stdout);
      }
    }
  return 0;
}

}  // namespace
}  // namespace tpc

int main(int argc, char** argv) { return tpc::run(argc, argv); }
