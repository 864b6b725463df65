// cuDNN's fused attention (runtime/cuda/cudnn_attention.h) on every "tc" attention case of
// tests/unit/cuda_kernel_cases.h it takes (plain and packed layouts, causal, head_dim 64 and 128, T 77 to
// 1024): planned, bound to device buffers that start as NaN bytes, run, and compared with the CPU backend
// in the kernel tests' metric, to the tolerance of our own kernels with one 16-bit P (tcAttentionTol).
#include <cuda_runtime.h>

#include <catch2/catch.hpp>

#include <dirent.h>

#include <cstring>
#include <filesystem>
#include <fstream>

#include "cuda_kernel_cases.h"
#include "gpt_step_support.h"
#include "gpu_test_support.h"
#include "runtime/cuda/cuda_backend.h"
#include "runtime/cuda/cudnn_attention.h"

using namespace tpc;
using namespace tpc::test;
using namespace tpc::test::kernels;

namespace {

std::vector<HostTensor> runCudnn(cuda::CudnnAttention& att, int plan, OneOp& o, const std::vector<HostTensor>& inputs) {
  std::vector<void*> ops, res;
  for (const HostTensor& t : inputs) {
    void* p = nullptr;
    CUDA_OK(cudaMalloc(&p, std::max<size_t>(t.bytes(), 1)));
    CUDA_OK(cudaMemcpy(p, t.raw(), t.bytes(), cudaMemcpyHostToDevice));
    ops.push_back(p);
  }
  for (const Value* r : o.node->results()) {
    void* p = nullptr;
    size_t bytes = static_cast<size_t>(r->type().bytes());
    CUDA_OK(cudaMalloc(&p, bytes));
    CUDA_OK(cudaMemset(p, 0xff, bytes));
    res.push_back(p);
  }
  void* ws = nullptr;
  size_t wsBytes = static_cast<size_t>(std::max<int64_t>(att.workspaceBytes(plan), 1));
  CUDA_OK(cudaMalloc(&ws, wsBytes));
  CUDA_OK(cudaMemset(ws, 0xff, wsBytes));
  auto b = att.bind(plan, ops, res, ws);
  if (!b.ok()) FAIL(b.error());
  auto ran = att.run(*b, nullptr);
  if (!ran.ok()) FAIL(ran.error());
  CUDA_OK(cudaDeviceSynchronize());
  std::vector<HostTensor> out;
  for (size_t r = 0; r < res.size(); ++r) {
    HostTensor t(o.node->result(r)->type());
    CUDA_OK(cudaMemcpy(t.raw(), res[r], t.bytes(), cudaMemcpyDeviceToHost));
    out.push_back(t);
  }
  for (void* p : ops) cudaFree(p);
  for (void* p : res) cudaFree(p);
  cudaFree(ws);
  return out;
}

}  // namespace

TEST_CASE("cudnn attention: every attention case cuDNN takes matches the CPU backend", "[gpu]") {
  requireGpuOrSkip();
  // The shipped deterministic backward (bit-identical on a second run), and the one with dQ accumulated by
  // atomics in a workspace that starts as NaN bytes (TPC_CUDNN_DETERMINISTIC=0: the same numbers, any bits).
  for (bool deterministic : {true, false}) {
    INFO((deterministic ? "deterministic" : "dQ by atomics"));
    auto att = cuda::CudnnAttention::create(deterministic);
    if (!att.ok()) FAIL(att.error());
    int compared = 0, taken = 0;
    for (const Case& c : allCases()) {
      if (!isTcAttentionCase(c)) continue;
      OneOp o = oneOp(c.op, c.types, c.attrs);
      if (!cuda::cudnnAttentionTakes(*o.node)) continue;
      INFO(c.name);
      ++taken;
      auto plan = (*att)->plan(*o.node);
      if (!plan.ok()) FAIL(plan.error());
      CHECK((*att)->plan(*o.node).value() == *plan);  // one plan per distinct shape
      std::mt19937 rng(std::hash<std::string>{}(c.name) & 0xffffffff);
      std::vector<HostTensor> in = c.make(rng);
      std::vector<HostTensor> want = runCpu(c, in, 4242, 7);
      std::vector<HostTensor> got = runCudnn(**att, *plan, o, in);
      compared += compareResults(o, got, want, tcAttentionTol(c, cuda::TcAttnOptions{}));
      if (!deterministic) continue;
      std::vector<HostTensor> again = runCudnn(**att, *plan, o, in);
      for (size_t r = 0; r < got.size(); ++r) CHECK(std::memcmp(got[r].raw(), again[r].raw(), got[r].bytes()) == 0);
    }
    INFO((*att)->version());
    // The causal cases without dropout, forward and backward, plain and packed.
    CHECK(taken >= 8);
    CHECK(compared >= 2 * taken);
  }
}

// The remembered engine choices in a cache folder.
static std::vector<std::string> engineFiles(const std::string& dir) {
  std::vector<std::string> files;
  if (DIR* d = opendir(dir.c_str())) {
    while (dirent* e = readdir(d))
      if (std::string name = e->d_name; name.size() > 13 && name.substr(name.size() - 13) == ".cudnn-engine")
        files.push_back(dir + "/" + name);
    closedir(d);
  }
  return files;
}

// Autotune (the default): the heuristics' distinct engine configs timed once per plan, the fastest remembered
// in the cache folder under the GPU, cuDNN's version and the shape, and a second planner in the process takes
// it without timing; the tuned and the untuned plans both match the CPU backend. The packed causal forward at
// scale 0.2 is a key no other test plans; cuDNN 9.14 on the H200 offers 7 distinct configs for it.
TEST_CASE("cudnn attention: the fastest engine config is timed once, remembered, and matches the CPU", "[gpu][autotune]") {
  requireGpuOrSkip();
  char tmpl[] = "/tmp/tpc-cudnn-autotune-XXXXXX";
  REQUIRE(mkdtemp(tmpl));
  // The cache folder for this test alone: restored and removed however the test ends.
  struct CacheDir {
    std::string dir, saved;
    bool had;
    explicit CacheDir(const char* d) : dir(d), had(std::getenv("TPC_CACHE_DIR") != nullptr) {
      if (had) saved = std::getenv("TPC_CACHE_DIR");
      setenv("TPC_CACHE_DIR", d, 1);
    }
    ~CacheDir() {
      if (had) setenv("TPC_CACHE_DIR", saved.c_str(), 1);
      else unsetenv("TPC_CACHE_DIR");
      std::error_code ec;
      std::filesystem::remove_all(dir, ec);
    }
  } cacheDir(tmpl);
  const int64_t B = 4, T = 512, H = 12, D = 64;
  const std::vector<int64_t> perm{2, 0, 3, 1, 4};
  AttrDict at = attrs({{"causal", true}, {"scale", 0.2}});
  at.set("perm", perm);
  Case c{"packed causal bf16 forward at scale 0.2", OpKind::AttentionQkv, {tt(DType::bf16, packedShape(B, T, H, D, perm))}, at,
         nullptr};
  OneOp o = oneOp(c.op, c.types, c.attrs);
  REQUIRE(cuda::cudnnAttentionTakes(*o.node));
  std::mt19937 rng(11);
  std::vector<HostTensor> in{uniformT(c.types[0], rng)};
  std::vector<HostTensor> want = runCpu(c, in, 4242, 7);

  auto tuned = cuda::CudnnAttention::create(true, true);
  if (!tuned.ok()) FAIL(tuned.error());
  auto p1 = (*tuned)->plan(*o.node);
  if (!p1.ok()) FAIL(p1.error());
  INFO((*tuned)->what(*p1) << ": " << (*tuned)->engine(*p1));
  CHECK((*tuned)->timedConfigs() >= 2);
  std::vector<HostTensor> got = runCudnn(**tuned, *p1, o, in);
  CHECK(compareResults(o, got, want, tcAttentionTol(c, cuda::TcAttnOptions{})) == 2);

  std::vector<std::string> files = engineFiles(tmpl);
  REQUIRE(files.size() == 1);
  std::ifstream f(files[0], std::ios::binary);
  std::string key, engine;
  std::getline(f, key);
  std::getline(f, engine);
  INFO(key);
  CHECK(key.find("cuDNN") != std::string::npos);
  CHECK(key.find(",512,") != std::string::npos);  // the shape is part of the key
  CHECK(engine == (*tuned)->engine(*p1));

  auto again = cuda::CudnnAttention::create(true, true);
  REQUIRE(again.ok());
  auto p2 = (*again)->plan(*o.node);
  REQUIRE(p2.ok());
  CHECK((*again)->timedConfigs() == 0);
  CHECK((*again)->engine(*p2) == (*tuned)->engine(*p1));
  std::vector<HostTensor> got2 = runCudnn(**again, *p2, o, in);
  for (size_t r = 0; r < got.size(); ++r) CHECK(std::memcmp(got[r].raw(), got2[r].raw(), got[r].bytes()) == 0);

  auto first = cuda::CudnnAttention::create(true, false);
  REQUIRE(first.ok());
  auto p3 = (*first)->plan(*o.node);
  REQUIRE(p3.ok());
  CHECK((*first)->timedConfigs() == 0);
  WARN("cuDNN's first config " << (*first)->engine(*p3) << ", timed fastest " << (*tuned)->engine(*p1));
  CHECK(compareResults(o, runCudnn(**first, *p3, o, in), want, tcAttentionTol(c, cuda::TcAttnOptions{})) == 2);

  // The sustained ranking (TPC_AUTOTUNE_SUSTAINED=1) does not take the quick one's choice: it times the configs
  // again and keeps its own under a second key.
  auto sustained = cuda::CudnnAttention::create(true, true, cuda::CandidateTiming::Sustained);
  REQUIRE(sustained.ok());
  auto p4 = (*sustained)->plan(*o.node);
  if (!p4.ok()) FAIL(p4.error());
  CHECK((*sustained)->timedConfigs() >= 2);
  CHECK(compareResults(o, runCudnn(**sustained, *p4, o, in), want, tcAttentionTol(c, cuda::TcAttnOptions{})) == 2);
  std::vector<std::string> keys;
  for (const std::string& file : engineFiles(tmpl)) {
    std::ifstream kf(file, std::ios::binary);
    std::getline(kf, keys.emplace_back());
  }
  REQUIRE(keys.size() == 2);
  CHECK((keys[0].find("| sustained") != std::string::npos) != (keys[1].find("| sustained") != std::string::npos));
}

// Whole bf16 training steps of a 2-layer GPT at T 128 (so that cuDNN takes the backward too), attention through
// cuDNN and through our kernels: the same losses to bf16 rounding, cuDNN in fewer launches, and two cuDNN runs
// bit-identical (the deterministic backward).
TEST_CASE("cudnn attention: a bf16 GPT trains 10 steps to our kernels' losses, bit-identically twice", "[gpu]") {
  requireGpuOrSkip();
  GptConfig cfg = smallGpt();
  cfg.positions = 128;
  auto g = gptStep(cfg, 2, "mixed-precision(dtype=bf16)," + kTrainPasses);
  std::vector<double> losses[3];
  int64_t launches[3] = {0, 0, 0};
  const char* modes[3] = {"tpc", "cudnn", "cudnn"};
  for (int k = 0; k < 3; ++k) {
    CudaOptions o;
    o.verbose = false;
    o.attention = modes[k];
    auto backend = createCudaBackend({}, o);
    INFO(modes[k]);
    prepareInitialState(*backend, *g, 1);
    std::mt19937 rng(7);
    TrainBatches batches;
    batches.shape = {2, 128};
    losses[k] = trainLosses(*backend, rng, 10, batches);
    launches[k] = backend->launchesPerStep();
  }
  const double worst = worstRelativeDifference(losses[0], losses[1]);
  INFO("losses " << losses[0].front() << " -> " << losses[0].back() << "; launches per step " << launches[0]
                 << " with our kernels, " << launches[1] << " with cuDNN; worst relative loss difference " << worst);
  CHECK(worst < 1e-2);
  CHECK(launches[1] < launches[0]);
  CHECK(losses[1] == losses[2]);
}

// gpt2's and gpt2-medium's attention ([16, 1024, 3, H, 64] packed, bf16; H 12 and 16), and head dim 128 (H 16, as
// in a 2048-wide model with 128-wide heads), through cuDNN, causal and not: the forward, then the backward as built deterministic (the default) and with dQ accumulated by atomics,
// each timed over 20 runs and run three times more to see whether its gradients keep their bits. The causal rows
// count half the FLOPs of the full ones: their rate against the full rows' is what the masked half costs.
TEST_CASE("bench: cuDNN attention at gpt2's shape with a deterministic backward or not", "[gpu][.bench]") {
  requireGpuOrSkip();
  struct AttnShape {
    int64_t H, D;
    bool causal;
  };
  for (auto [H, D, causal] : std::vector<AttnShape>{{12, 64, true}, {12, 64, false}, {16, 64, true}, {16, 64, false},
                                                  {16, 128, true}, {16, 128, false}}) {
    const int64_t B = 16, T = 1024;
    const std::vector<int64_t> perm{2, 0, 3, 1, 4};
    AttrDict a = attrs({{"causal", causal}});
    a.set("perm", perm);
    const Shape qkv = packedShape(B, T, H, D, perm), o{B, T, H, D}, lse{B, H, T};
    const DType bf = DType::bf16;
    OneOp fwd = oneOp(OpKind::AttentionQkv, {tt(bf, qkv)}, a);
    OneOp bwd = oneOp(OpKind::AttentionQkvGrad, {tt(bf, o), tt(bf, qkv), tt(bf, o), tt(DType::f32, lse)}, a);
    std::mt19937 rng(7);
    HostTensor qkvH = uniformT(tt(bf, qkv), rng), doutH = uniformT(tt(bf, o), rng);
    auto upload = [](const HostTensor& t) {
      void* p = nullptr;
      CUDA_OK(cudaMalloc(&p, t.bytes()));
      CUDA_OK(cudaMemcpy(p, t.raw(), t.bytes(), cudaMemcpyHostToDevice));
      return p;
    };
    auto alloc = [](const Shape& s, DType dt) {
      void* p = nullptr;
      CUDA_OK(cudaMalloc(&p, static_cast<size_t>(TensorType(dt, s).bytes())));
      return p;
    };
    void *dQkv = upload(qkvH), *dDout = upload(doutH), *dOut = alloc(o, bf), *dLse = alloc(lse, DType::f32),
         *dGrad = alloc(qkv, bf);
    cudaEvent_t e0, e1;
    CUDA_OK(cudaEventCreate(&e0));
    CUDA_OK(cudaEventCreate(&e1));
    for (bool deterministic : {true, false}) {
      auto att = cuda::CudnnAttention::create(deterministic);
      if (!att.ok()) FAIL(att.error());
      auto pf = (*att)->plan(*fwd.node), pb = (*att)->plan(*bwd.node);
      if (!pf.ok()) FAIL(pf.error());
      if (!pb.ok()) FAIL(pb.error());
      void* ws = nullptr;
      CUDA_OK(cudaMalloc(&ws, static_cast<size_t>(std::max((*att)->workspaceBytes(*pf), (*att)->workspaceBytes(*pb)) + 1)));
      auto bf_ = (*att)->bind(*pf, {dQkv}, {dOut, dLse}, ws);
      auto bb = (*att)->bind(*pb, {dDout, dQkv, dOut, dLse}, {dGrad}, ws);
      REQUIRE(bf_.ok());
      REQUIRE(bb.ok());
      auto timeIt = [&](int binding) {
        for (int i = 0; i < 3; ++i) REQUIRE((*att)->run(binding, nullptr).ok());
        CUDA_OK(cudaEventRecord(e0));
        for (int i = 0; i < 20; ++i) REQUIRE((*att)->run(binding, nullptr).ok());
        CUDA_OK(cudaEventRecord(e1));
        CUDA_OK(cudaEventSynchronize(e1));
        float ms = 0;
        CUDA_OK(cudaEventElapsedTime(&ms, e0, e1));
        return ms / 20;
      };
      float fms = timeIt(*bf_), bms = timeIt(*bb);
      std::vector<std::vector<char>> bits;
      for (int i = 0; i < 3; ++i) {
        REQUIRE((*att)->run(*bb, nullptr).ok());
        CUDA_OK(cudaDeviceSynchronize());
        bits.emplace_back(static_cast<size_t>(TensorType(bf, qkv).bytes()));
        CUDA_OK(cudaMemcpy(bits.back().data(), dGrad, bits.back().size(), cudaMemcpyDeviceToHost));
      }
      const bool same = bits[0] == bits[1] && bits[1] == bits[2];
      std::printf("H %d, D %d, %s: %s\n  forward (%s) %.3f ms (%.1f TFLOP/s), backward (%s) %.3f ms (%.1f TFLOP/s), workspace %.1f MiB; "
                  "gradients of 3 runs %s\n",
                  (int)H, (int)D, causal ? "causal" : "full", (*att)->what(*pb).c_str(), (*att)->engine(*pf).c_str(), fms, (*att)->flops(*pf) / fms / 1e9, (*att)->engine(*pb).c_str(), bms, (*att)->flops(*pb) / bms / 1e9,
                  (*att)->workspaceBytes(*pb) / 1048576.0, same ? "bit-identical" : "DIFFER");
      if (deterministic) CHECK(same);
      cudaFree(ws);
    }
    for (void* p : {dQkv, dDout, dOut, dLse, dGrad}) cudaFree(p);
    for (cudaEvent_t e : {e0, e1}) cudaEventDestroy(e);
  }
}
