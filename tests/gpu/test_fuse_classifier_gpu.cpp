// The fused classifier on the GPU (issue 7): a 2-layer GPT's step with cross_entropy_with_grad (one kernel for
// the loss and dlogits, dlogits written over the logits) trains to the unfused step's losses and state with
// one launch fewer, fp32 and bf16, and matches the CPU backend; megatron-tp 2 (vocab_xent_grad over the logits
// shard) on virtual ranks matches tp 1 with the fused classifier.
#include <catch2/catch.hpp>

#include <cmath>
#include <random>

#include "gpt_step_support.h"
#include "gpu_test_support.h"
#include "runtime/cuda/cuda_backend.h"

namespace tpc {
namespace {

struct Run {
  std::vector<double> losses;
  std::map<std::string, std::string> state;
  int64_t launches = 0;
};

Run train(const Graph& g, int64_t steps, std::unique_ptr<Backend> backend) {
  test::prepareInitialState(*backend, g, 1);
  std::mt19937 rng(7);
  Run run;
  run.losses = test::trainLosses(*backend, rng, steps);
  run.state = test::stateBytes(*backend, g);
  run.launches = backend->launchesPerStep();
  return run;
}

std::unique_ptr<Backend> gpu(const Graph& g) {
  CudaOptions o;
  o.seed = 99;
  o.verbose = false;
  return createCudaBackend(test::rankGraphs(g), o);
}

GptConfig gpt() {
  GptConfig g = test::smallGpt();
  g.heads = 8;
  g.paddedVocab = 1024;
  return g;
}

// The step as `tpc run` compiles it for the GPU: each rank's program through `passes` (after partition).
std::unique_ptr<Graph> step(int64_t tp, bool bf16, const std::string& passes) {
  auto g = test::gptStep(gpt(), 4, test::megatronTp(tp) + (bf16 ? "mixed-precision(dtype=bf16)," : "") + test::kTrainPasses);
  if (tp == 1) test::runPasses(*g, passes);
  return g;
}

int countOps(const Graph& g, OpKind op) {
  int n = 0;
  for (const Node* node : g.nodes()) n += node->op() == op;
  return n;
}

double worstRel(const std::vector<double>& a, const std::vector<double>& b) { return test::worstRelError(a, b); }

}  // namespace

TEST_CASE("cuda fuse-classifier: a 2-layer GPT trains 10 steps to the unfused step's state bit for bit with one launch fewer",
          "[gpu][fuse_classifier]") {
  test::requireGpuOrSkip();
  for (bool bf16 : {false, true}) {
    INFO((bf16 ? "bf16" : "fp32"));
    auto plain = step(1, bf16, "fuse");
    auto fused = step(1, bf16, "fuse-classifier,fuse");
    REQUIRE(countOps(*fused, OpKind::CrossEntropyWithGrad) == 1);
    Run a = train(*plain, 10, gpu(*plain)), b = train(*fused, 10, gpu(*fused));
    WARN((bf16 ? "bf16" : "fp32") << ": losses " << a.losses.front() << " -> " << a.losses.back() << "; launches per step "
                                  << a.launches << " unfused, " << b.launches << " fused; worst relative loss difference "
                                  << worstRel(b.losses, a.losses));
    // The fused kernel is cross_entropy_grad's (dlogits: the same bits, so the same state) writing the loss too,
    // from the same row statistics as cross_entropy's kernel (the loss within a last-bit difference).
    CHECK(b.state == a.state);
    CHECK(worstRel(b.losses, a.losses) <= 1e-6);
    CHECK(b.launches == a.launches - 1);
    if (!bf16) {  // and the CPU backend's step (fp32, the unfused ops)
      CpuOptions co;
      co.threads = 4;
      co.seed = 99;
      Run cpu = train(*plain, 10, createCpuBackend(co));
      CHECK(worstRel(b.losses, cpu.losses) <= 1e-4);
    }
  }
}

TEST_CASE("cuda fuse-classifier: megatron-tp 2 on virtual ranks (vocab_xent_grad over the logits shard) matches tp 1 fused",
          "[gpu][fuse_classifier]") {
  test::requireGpuOrSkip();
  auto one = step(1, false, "fuse-classifier,fuse");
  auto two = step(2, false, "");
  Run ref = train(*one, 3, gpu(*one));
  // As tpc run: fuse-classifier (nothing to fuse: the sharded loss is other ops) and fuse on each rank's program.
  std::vector<std::unique_ptr<Graph>> ranks = test::rankGraphs(*two);
  for (auto& r : ranks) {
    PassManager pm;
    REQUIRE(pm.addPipeline("fuse-classifier,fuse", "").ok());
    REQUIRE(pm.run(*r).ok());
    CHECK(countOps(*r, OpKind::VocabXentGrad) == 1);
  }
  CudaOptions o;
  o.seed = 99;
  o.verbose = false;
  Run got = train(*two, 3, createCudaBackend(std::move(ranks), o));
  double err = worstRel(got.losses, ref.losses);
  WARN("tp 2 virtual ranks vs tp 1 fused: loss rel err " << err);
  CHECK(err <= 1e-5);
}

}  // namespace tpc
