// NvrtcCompiler::compileAll: a model's kernels compiled on several threads at once (a fresh H200 host took 20 s
// for gpt2's 35 one at a time), each once, into the cache folder, with compile() then returning the cubins a
// one-at-a-time compile gives; a failing kernel is the error, named as compile() names it.
#ifdef TPC_HAVE_CUDA

#include <catch2/catch.hpp>

#include <cstdlib>
#include <filesystem>

#include "runtime/cuda/nvrtc_compiler.h"
#include "test_support.h"

namespace tpc {
namespace {

std::string kernelSource(int k) {
  return cat("extern \"C\" __global__ void scale", k, "(float* x, int n) {\n",
             "  int i = blockIdx.x * blockDim.x + threadIdx.x;\n", "  if (i < n) x[i] = x[i] * ", k, ".0f + ", k, ";\n}\n");
}

size_t filesEnding(const std::filesystem::path& dir, const std::string& ext) {
  size_t n = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    const std::string name = e.path().filename().string();
    n += name.size() >= ext.size() && name.compare(name.size() - ext.size(), ext.size(), ext) == 0;
  }
  return n;
}

}  // namespace

TEST_CASE("nvrtc: compileAll compiles each kernel once on several threads, and compile() returns one-at-a-time's cubins",
          "[cuda]") {
  test::TempDir parallelDir, serialDir;
  std::vector<std::string> sources;
  for (int k = 1; k <= 5; ++k) sources.push_back(kernelSource(k));
  std::vector<cuda::KernelSource> kernels;
  for (int k = 0; k < 5; ++k) kernels.push_back({&sources[k], cat("scale", k + 1), false});
  kernels.push_back({&sources[2], "scale3", false});  // named twice: compiled once
  cuda::NvrtcCompiler parallel(90, parallelDir.path.string());
  Status st = parallel.compileAll(kernels, 3);
  REQUIRE(st.ok());
  CHECK(parallel.stats().compiled == 5);
  CHECK(parallel.stats().cacheHits == 0);
  CHECK(filesEnding(parallelDir.path, ".cubin") == 5);
  CHECK(filesEnding(parallelDir.path, "") == 5);  // no temp file left behind

  cuda::NvrtcCompiler serial(90, serialDir.path.string());
  for (int k = 0; k < 5; ++k) {
    INFO("kernel scale" << k + 1);
    auto a = parallel.compile(sources[k], cat("scale", k + 1));
    auto b = serial.compile(sources[k], cat("scale", k + 1));
    REQUIRE(a.ok());
    REQUIRE(b.ok());
    CHECK(*a == *b);
    CHECK(!a->empty());
  }
  CHECK(parallel.stats().compiled == 5);  // compile() took compileAll's cubins
  CHECK(parallel.stats().cacheHits == 0);
  CHECK(serial.stats().compiled == 5);

  // Another process later (a new compiler on the same folder): nothing to compile, compile() reads the cache.
  cuda::NvrtcCompiler again(90, parallelDir.path.string());
  REQUIRE(again.compileAll(kernels, 4).ok());
  CHECK(again.stats().compiled == 0);
  REQUIRE(again.compile(sources[0], "scale1").ok());
  CHECK(again.stats().cacheHits == 1);
}

TEST_CASE("nvrtc: compileAll's first failing kernel is the error, its source kept, the others cached", "[cuda]") {
  test::TempDir dir;
  const std::string good = kernelSource(7), bad = "extern \"C\" __global__ void broken(float* x) { x[0] = y; }\n",
                    bad2 = "extern \"C\" __global__ void broken2() { undefined_call(); }\n";
  std::vector<cuda::KernelSource> kernels = {{&good, "scale7", false}, {&bad, "broken", false}, {&bad2, "broken2", false}};
  cuda::NvrtcCompiler nvrtc(90, dir.path.string());
  Status st = nvrtc.compileAll(kernels, 3);
  REQUIRE_FALSE(st.ok());
  CHECK(st.error().find("compiling kernel broken for sm_90 failed") != std::string::npos);
  CHECK(st.error().find("broken2") == std::string::npos);
  CHECK(st.error().find(".failed.cu") != std::string::npos);
  CHECK(filesEnding(dir.path, ".failed.cu") == 2);
  CHECK(filesEnding(dir.path, ".cubin") == 1);  // scale7 compiled and cached despite the failures
  cuda::NvrtcCompiler again(90, dir.path.string());
  REQUIRE(again.compile(good, "scale7").ok());
  CHECK(again.stats().cacheHits == 1);
}

TEST_CASE("nvrtc: TPC_COMPILE_THREADS sets compileAll's threads and names a bad value", "[cuda]") {
  unsetenv("TPC_COMPILE_THREADS");
  auto n = cuda::compileThreadsFromEnv();
  REQUIRE(n.ok());
  CHECK(*n >= 1);
  CHECK(*n <= 16);
  setenv("TPC_COMPILE_THREADS", "4", 1);
  n = cuda::compileThreadsFromEnv();
  REQUIRE(n.ok());
  CHECK(*n == 4);
  for (const char* bad : {"0", "65", "x", "4x", "-2"}) {
    setenv("TPC_COMPILE_THREADS", bad, 1);
    n = cuda::compileThreadsFromEnv();
    INFO("TPC_COMPILE_THREADS=" << bad);
    REQUIRE_FALSE(n.ok());
    CHECK(n.error().find(std::string("TPC_COMPILE_THREADS=") + bad + ":") != std::string::npos);
  }
  unsetenv("TPC_COMPILE_THREADS");
}

}  // namespace tpc

#endif  // TPC_HAVE_CUDA
