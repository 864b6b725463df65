// cuBLASLt autotuning (CudaOptions::matmulAutotune, matmul_autotune.h) on the GPU: a GEMM of a shape no other
// test uses is timed once, its choice written to the cache folder, and a second backend gives the same bits;
// with autotuning off (the heuristic's first choice) the product agrees within bf16 rounding, and both agree
// with the CPU backend. Sustained timing (TPC_AUTOTUNE_SUSTAINED=1) keeps its choice under its own key.
#include <catch2/catch.hpp>

#include <dirent.h>
#include <stdlib.h>

#include <cmath>
#include <fstream>
#include <random>

#include "gpu_test_support.h"
#include "runtime/cpu/cpu_backend.h"
#include "runtime/cuda/cuda_backend.h"

namespace tpc {
namespace {

// x [3, 40, 72] times w [72, n]: n 136 here, another n where a test needs a GEMM the process has not timed yet
// (choices are remembered in the process as well as on disk).
std::unique_ptr<Graph> oddMatmul(int64_t n = 136) {
  auto g = std::make_unique<Graph>("autotune");
  Value* x = g->addInput("x", TensorType(DType::bf16, {3, 40, 72}));
  Value* w = g->addInput("w", TensorType(DType::bf16, {72, n}));
  auto m = g->create(OpKind::Matmul, {x, w});
  REQUIRE(m.ok());
  g->addOutput((*m)->result(), "y");
  return g;
}

TensorMap randomInputs(const Graph& g) {
  std::mt19937 rng(3);
  std::uniform_real_distribution<double> u(-1, 1);
  TensorMap m;
  for (const Value* v : g.inputs()) {
    HostTensor t(v->type());
    for (int64_t i = 0; i < t.numel(); ++i) t.setFromDouble(i, u(rng));
    m[v->name()] = t;
  }
  return m;
}

HostTensor runCuda(const Graph& g, const TensorMap& in, bool autotune) {
  CudaOptions o;
  o.verbose = false;
  o.matmulAutotune = autotune;
  auto b = createCudaBackend({}, o);
  Status st = b->prepare(g, {});
  INFO((st.ok() ? std::string() : st.error()));
  REQUIRE(st.ok());
  auto r = b->step(in, 1);
  INFO((r.ok() ? std::string() : r.error()));
  REQUIRE(r.ok());
  return r->at("y");
}

HostTensor runCpu(const Graph& g, const TensorMap& in) {
  auto cpu = createCpuBackend({});
  REQUIRE(cpu->prepare(g, {}).ok());
  auto want = cpu->step(in, 1);
  REQUIRE(want.ok());
  return want->at("y");
}

double worstDifference(const HostTensor& got, const HostTensor& want) { return test::worstAbsError(got, want); }

double largestMagnitude(const HostTensor& t) {
  double m = 0;
  for (int64_t i = 0; i < t.numel(); ++i) m = std::max(m, std::abs(t.getAsDouble(i)));
  return m;
}

std::vector<std::string> algoFiles(const std::string& dir) {
  std::vector<std::string> files;
  if (DIR* d = opendir(dir.c_str())) {
    while (dirent* e = readdir(d)) {
      std::string name = e->d_name;
      if (name.size() > 8 && name.substr(name.size() - 8) == ".lt-algo") files.push_back(dir + "/" + name);
    }
    closedir(d);
  }
  return files;
}

TEST_CASE("cuda matmul autotune: the timed choice is remembered on disk, gives the same bits again, and agrees with "
          "the heuristic's choice and the CPU", "[gpu][autotune]") {
  test::requireGpuOrSkip();
  char tmpl[] = "/tmp/tpc-autotune-XXXXXX";
  REQUIRE(mkdtemp(tmpl));
  const char* old = std::getenv("TPC_CACHE_DIR");
  std::string saved = old ? old : "";
  setenv("TPC_CACHE_DIR", tmpl, 1);
  unsetenv("TPC_MATMUL_AUTOTUNE");
  auto g = oddMatmul();
  TensorMap in = randomInputs(*g);
  HostTensor first = runCuda(*g, in, true);
  std::vector<std::string> files = algoFiles(tmpl);
  REQUIRE(files.size() == 1);  // one GEMM, one remembered algorithm
  std::ifstream f(files[0], std::ios::binary);
  std::string key;
  std::getline(f, key);
  INFO(key);
  CHECK(key.find("136") != std::string::npos);  // the GEMM's shape is part of its key
  CHECK(key.find("cublasLt") != std::string::npos);
  HostTensor again = runCuda(*g, in, true);
  CHECK(std::memcmp(first.raw(), again.raw(), first.bytes()) == 0);
  HostTensor heuristic = runCuda(*g, in, false);
  const HostTensor ref = runCpu(*g, in);
  const double worstTuned = worstDifference(first, ref), worstHeuristic = worstDifference(heuristic, ref),
               scale = largestMagnitude(ref);
  WARN("autotuned: worst difference to the CPU " << worstTuned << ", heuristic " << worstHeuristic << " of " << scale);
  CHECK(worstTuned <= 1e-2 * scale);
  CHECK(worstHeuristic <= 1e-2 * scale);
  if (old) setenv("TPC_CACHE_DIR", saved.c_str(), 1);
  else unsetenv("TPC_CACHE_DIR");
}

// Sets an environment variable for one scope and puts the old value back.
struct ScopedEnv {
  std::string name, saved;
  bool had;
  ScopedEnv(const char* n, const char* value) : name(n) {
    const char* old = std::getenv(n);
    had = old != nullptr;
    if (had) saved = old;
    if (value) setenv(n, value, 1);
    else unsetenv(n);
  }
  ~ScopedEnv() {
    if (had) setenv(name.c_str(), saved.c_str(), 1);
    else unsetenv(name.c_str());
  }
};

TEST_CASE("cuda matmul autotune: sustained timing keeps its choice under its own key, agrees with the CPU, and a bad "
          "TPC_AUTOTUNE_SUSTAINED is one clear error", "[gpu][autotune]") {
  test::requireGpuOrSkip();
  char tmpl[] = "/tmp/tpc-autotune-sustained-XXXXXX";
  REQUIRE(mkdtemp(tmpl));
  ScopedEnv cache("TPC_CACHE_DIR", tmpl), tune("TPC_MATMUL_AUTOTUNE", nullptr);
  auto g = oddMatmul(152);
  TensorMap in = randomInputs(*g);
  {
    ScopedEnv sustained("TPC_AUTOTUNE_SUSTAINED", "1");
    HostTensor tuned = runCuda(*g, in, true);
    std::vector<std::string> files = algoFiles(tmpl);
    REQUIRE(files.size() == 1);
    std::ifstream f(files[0], std::ios::binary);
    std::string key;
    std::getline(f, key);
    INFO(key);
    CHECK(key.find("| sustained") != std::string::npos);
    const HostTensor ref = runCpu(*g, in);
    CHECK(worstDifference(tuned, ref) <= 1e-2 * largestMagnitude(ref));
  }
  // The quick timing's choice is a second file: the two rankings do not share a key.
  runCuda(*g, in, true);
  CHECK(algoFiles(tmpl).size() == 2);
  {
    ScopedEnv bad("TPC_AUTOTUNE_SUSTAINED", "yes");
    CudaOptions o;
    o.verbose = false;
    auto b = createCudaBackend({}, o);
    Status st = b->prepare(*g, {});
    REQUIRE_FALSE(st.ok());
    CHECK(st.error().find("TPC_AUTOTUNE_SUSTAINED must be 0 or 1, got 'yes'") != std::string::npos);
  }
}

}  // namespace
}  // namespace tpc
