// The collectives on a communication stream of their own (CudaOptions::collectiveStream): a 2-layer GPT on
// virtual ranks (tp 2 and tp 4 on the one GPU) trains bit-identically with and without it, and its captured
// graph forks to that stream and joins back (more dependency edges than the one-stream chain).
#include <catch2/catch.hpp>

#include <cstring>
#include <random>

#include "gpt_step_support.h"
#include "gpu_test_support.h"
#include "runtime/cuda/cuda_backend.h"

namespace tpc {
namespace {

struct Run {
  std::vector<double> losses;
  std::map<std::string, std::vector<float>> params;
  CudaStepGraphInfo info;
};

Run train(const Graph& g, bool commStream, int64_t profileStep = 0) {
  CudaOptions o;
  o.seed = 99;
  o.verbose = false;
  o.collectiveStream = commStream;
  o.profileStep = profileStep;
  auto backend = createCudaBackend(test::rankGraphs(g), o);
  test::prepareInitialState(*backend, g, 1);
  Run run;
  auto info = cudaStepGraphInfo(*backend);
  REQUIRE(info);
  run.info = *info;
  std::mt19937 rng(7);
  run.losses = test::trainLosses(*backend, rng, 4);
  for (const Value* p : g.params()) {
    auto x = backend->readState(p->name());
    REQUIRE(x.ok());
    run.params[p->name()] = std::vector<float>(x->data<float>(), x->data<float>() + x->numel());
  }
  return run;
}

void requireIdentical(const Run& a, const Run& b) {
  REQUIRE(a.losses.size() == b.losses.size());
  for (size_t i = 0; i < a.losses.size(); ++i) {
    INFO("step " << i + 1);
    CHECK(std::memcmp(&a.losses[i], &b.losses[i], sizeof(double)) == 0);
  }
  for (const auto& [name, v] : a.params) {
    INFO(name);
    REQUIRE(b.params.count(name));
    REQUIRE(b.params.at(name).size() == v.size());
    CHECK(std::memcmp(v.data(), b.params.at(name).data(), v.size() * sizeof(float)) == 0);
  }
}

}  // namespace

TEST_CASE("cuda comm stream: tp 2 and 4 virtual ranks train bit-identically with and without it, and the graph forks and joins", "[gpu][comm_stream]") {
  test::requireGpuOrSkip();
  for (int64_t tp : {2, 4}) {
    INFO("tp " << tp);
    GptConfig c = test::smallGpt();
    c.heads = 8;
    c.paddedVocab = 1024;
    c.hiddenDropout = c.attentionDropout = 0.1;
    auto g = test::gptStep(c, 4, test::megatronTp(tp) + test::kTrainPasses);
    Run one = train(*g, false), two = train(*g, true);
    requireIdentical(one, two);
    const CudaStepGraphInfo &a = one.info, &b = two.info;
    WARN("tp " << tp << ": " << b.launches << " launches, " << b.commLaunches << " on the comm stream in " << b.collectives
               << " collectives; " << b.forks << " forks, " << b.joins << " joins, " << b.overlapped
               << " launches overlap a collective; graph " << a.graphNodes << " nodes / " << a.graphEdges << " edges on one stream, "
               << b.graphNodes << " / " << b.graphEdges << " with the comm stream");
    // One stream: no collective scheduled, the graph a chain.
    CHECK(a.commLaunches == 0);
    CHECK(a.graphEdges == a.graphNodes - 1);
    // Comm stream: the same launches; the collectives' kernels on the comm stream; forks and joins in the graph
    // (each join but the one at the end adds an edge into a compute node).
    CHECK(b.launches == a.launches);
    CHECK(b.graphNodes == a.graphNodes);
    CHECK(b.collectives >= 8);
    CHECK(b.commLaunches >= b.collectives);
    CHECK(b.forks >= 1);
    CHECK(b.forks <= b.collectives);
    CHECK(b.joins >= 2);
    CHECK(b.overlapped > 0);
    CHECK(b.graphEdges > b.graphNodes - 1);
  }
}

TEST_CASE("cuda comm stream: a profiled step (one stream) in a comm-stream run gives the same results", "[gpu][comm_stream]") {
  test::requireGpuOrSkip();
  GptConfig c = test::smallGpt();
  c.heads = 8;
  c.paddedVocab = 1024;
  auto g = test::gptStep(c, 4, test::megatronTp(2) + test::kTrainPasses);
  Run plain = train(*g, true), profiled = train(*g, true, 2);
  requireIdentical(plain, profiled);
}

}  // namespace tpc
