// Activation recomputation (issue 8): `recompute(mode=full|selective)` lowers the planned peak memory and
// leaves every loss and updated parameter bit-identical (dropout on, gradient accumulation, tp 2).
#include <catch2/catch.hpp>

#include <random>

#include "gpt_step_support.h"
#include "runtime/memory_estimate.h"
#include "test_support.h"

namespace tpc {
namespace {

std::unique_ptr<Graph> step(const std::string& recompute, int64_t accum, int64_t tp = 1, int64_t batch = 2,
                            int64_t seq = 16) {
  GptConfig gc = test::smallGpt();
  gc.layers = 3;
  gc.positions = seq;
  gc.hiddenDropout = gc.attentionDropout = 0.1;
  return test::gptStep(gc, batch,
                       test::megatronTp(tp) + "autodiff(accum=" + std::to_string(accum) + "),cse,dce" +
                           (recompute.empty() ? "" : ",recompute(mode=" + recompute + ")"),
                       accum);
}

// Losses of 3 steps and the final parameters, all as raw floats.
std::vector<float> trace(const Graph& g, int64_t accum) {
  CpuOptions o;
  o.threads = 2;
  auto b = test::preparedCpuBackend(g, o, 5);
  std::mt19937 rng(11);
  test::TrainBatches batches;
  batches.shape = accum > 1 ? Shape{accum, 2, 16} : Shape{2, 16};
  batches.firstStepIndex = 0;
  std::vector<float> out;
  for (double loss : test::trainLosses(*b, rng, 3, batches)) out.push_back(static_cast<float>(loss));
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
  CHECK(bad.err.find("--recompute must be none, selective or full, got 'some'") != std::string::npos);
}

}  // namespace tpc
