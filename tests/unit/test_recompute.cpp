// Activation recomputation (issue 8): `recompute(mode=full|selective)` lowers the planned peak memory and
// leaves every loss and updated parameter bit-identical (dropout on, gradient accumulation, tp 2).
#include <catch2/catch.hpp>

#include <random>

#include "models/gpt.h"
#include "passes/pipeline.h"
#include "passes/sharding/sharding.h"
#include "runtime/cpu/cpu_backend.h"
#include "runtime/cpu/cpu_mesh_backend.h"
#include "runtime/memory_estimate.h"
#include "runtime/param_init.h"
#include "test_support.h"

namespace tpc {
namespace {

std::unique_ptr<Graph> step(const std::string& recompute, int64_t accum, int64_t tp = 1, int64_t batch = 2,
                            int64_t seq = 16) {
  GptConfig gc;
  gc.layers = 3;
  gc.hidden = 64;
  gc.heads = 4;
  gc.vocab = 100;
  gc.paddedVocab = 256;
  gc.positions = seq;
  gc.hiddenDropout = gc.attentionDropout = 0.1;
  TrainConfig tc;
  tc.microBatch = batch;
  tc.globalBatch = batch * accum;
  tc.seqLength = seq;
  auto m = buildGpt(gc, tc);
  REQUIRE(m.ok());
  std::unique_ptr<Graph> g = std::move(m->forward);
  std::string passes = (tp > 1 ? "megatron-tp(tp=" + std::to_string(tp) + ")," : std::string()) +
                       "autodiff(accum=" + std::to_string(accum) + "),cse,dce" +
                       (recompute.empty() ? "" : ",recompute(mode=" + recompute + ")");
  PassManager pm;
  Status s = pm.addPipeline(passes);
  REQUIRE(s.ok());
  s = pm.run(*g);
  INFO((s.ok() ? std::string() : s.error()));
  REQUIRE(s.ok());
  if (tp > 1) REQUIRE(propagatePlacements(*g).ok());
  return g;
}

// Losses of 3 steps and the final parameters, all as raw floats.
std::vector<float> trace(const Graph& g, int64_t accum) {
  CpuOptions o;
  o.threads = 2;
  std::unique_ptr<Backend> b;
  if (g.mesh().empty()) {
    b = createCpuBackend(o);
  } else {
    std::vector<std::unique_ptr<Graph>> ranks;
    for (int64_t r = 0; r < g.mesh().numRanks(); ++r) ranks.push_back(std::move(*partitionForRank(g, r)));
    b = createCpuMeshBackend(std::move(ranks), o);
  }
  TensorMap state;
  for (const Value* p : g.params()) state[p->name()] = initParam(*p, 5);
  REQUIRE(b->prepare(g, state).ok());
  std::mt19937 rng(11);
  std::vector<float> out;
  for (int64_t s = 0; s < 3; ++s) {
    TensorMap in;
    for (const char* name : {"tokens", "targets"}) {
      HostTensor t(TensorType(DType::i32, accum > 1 ? Shape{accum, 2, 16} : Shape{2, 16}));
      for (int64_t i = 0; i < t.numel(); ++i) t.data<int32_t>()[i] = static_cast<int32_t>(rng() % 100);
      in[name] = t;
    }
    in["lr"] = HostTensor::scalarF32(1e-3f);
    in["step"] = HostTensor::scalarF32(float(s + 1));
    auto r = b->step(in, s);
    INFO((r.ok() ? std::string() : r.error()));
    REQUIRE(r.ok());
    out.push_back(r->at("loss").data<float>()[0]);
  }
  for (const Value* p : g.params()) {
    auto t = b->readState(p->name());
    REQUIRE(t.ok());
    out.insert(out.end(), t->data<float>(), t->data<float>() + t->numel());
  }
  return out;
}

}  // namespace

TEST_CASE("recompute: full and selective give bit-identical training, dropout on", "[recompute]") {
  for (int64_t accum : {1, 2}) {
    auto ref = trace(*step("", accum), accum);
    CHECK(trace(*step("selective", accum), accum) == ref);
    CHECK(trace(*step("full", accum), accum) == ref);
  }
  auto tp = trace(*step("", 1, 2), 1);
  CHECK(trace(*step("full", 1, 2), 1) == tp);
}

TEST_CASE("recompute: the planned peak drops, full below selective below none", "[recompute]") {
  // Activations must dominate the gradients (all alive at once before clipping): batch 8 x seq 64.
  int64_t none = estimateMemory(*step("", 1, 1, 8, 64)).peakActivationBytes;
  int64_t selective = estimateMemory(*step("selective", 1, 1, 8, 64)).peakActivationBytes;
  int64_t full = estimateMemory(*step("full", 1, 1, 8, 64)).peakActivationBytes;
  WARN("peak activations: none " << none << ", selective " << selective << ", full " << full << " bytes");
  CHECK(selective < none);
  CHECK(full < selective);
}

TEST_CASE("recompute: tpc dump --memory prints the planned peak per config", "[recompute][cli]") {
  auto peak = [](const std::string& mode) {
    auto r = test::runCommand(test::tpcBinary() + " dump " + test::binaryPath("models/gpt2.fb") +
                              " --memory --micro-batch-size 2 --recompute " + mode);
    INFO(r.err);
    REQUIRE(r.exitCode == 0);
    REQUIRE(r.out.find("parameters + optimizer state  1.39 GiB") != std::string::npos);
    auto k = r.out.find("planned peak");
    REQUIRE(k != std::string::npos);
    return std::stod(r.out.substr(r.out.find_first_of("0123456789", k)));
  };
  CHECK(peak("full") < peak("none"));
  auto bad = test::runCommand(test::tpcBinary() + " dump " + test::binaryPath("models/tiny.fb") + " --memory --recompute some");
  CHECK(bad.exitCode == 1);
  CHECK(bad.err.find("config.recompute must be none, selective or full, got 'some'") != std::string::npos);
}

}  // namespace tpc
