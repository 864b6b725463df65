// Evaluation on the GPU (tpc run --eval-interval on the CUDA backend): a tiny GPT trained on the GPU with
// an evaluation every 2 steps gets, from the evaluator on a second CudaBackend, the validation losses the
// CPU evaluator computes from the same parameters (1e-4 relative in fp32), single-rank (parameters copied
// device to device) and tp 2 on virtual ranks (unsharded: through the host; sharded as the training is: each
// rank's blocks device to device).
#include <catch2/catch.hpp>

#include <chrono>
#include <cmath>
#include <random>
#include <sstream>

#include "gpt_step_support.h"
#include "gpu_test_support.h"
#include "runtime/cuda/cuda_backend.h"
#include "runtime/evaluator.h"
#include "runtime/param_init.h"

namespace tpc {
namespace {

// The same windows every time it is rebuilt: each evaluation reads the same "validation split".
struct FixedBatches : test::LearnableBatches {
  FixedBatches() : LearnableBatches(100, 11, 7, 3) {}
};

ModelFile tinyGpt() {
  GptConfig g = test::smallGpt();
  g.heads = 8;
  g.paddedVocab = 1024;
  g.hiddenDropout = g.attentionDropout = 0.1;  // training draws dropout; evaluation must not
  return test::gptModel(g, 4);
}

}  // namespace

TEST_CASE("cuda eval: validation losses on the GPU equal the CPU evaluator's on the same parameters", "[gpu][eval]") {
  test::requireGpuOrSkip();
  for (int64_t tp : {1, 2}) {
    ModelFile m = tinyGpt();
    std::unique_ptr<Graph> step = m.forward->clone();
    test::runPasses(*step, test::megatronTp(tp) + "autodiff(loss=" + m.lossOutput + ", clip-grad=1.0),cse,dce");
    std::vector<std::unique_ptr<Graph>> ranks = test::rankGraphs(*step);
    CudaOptions o;
    o.seed = 5;
    o.verbose = false;
    o.collectives = "virtual";
    auto training = createCudaBackend(std::move(ranks), o);
    TensorMap state;
    for (const Value* p : step->params()) state[p->name()] = initParam(*p, 3);
    Status s = training->prepare(*step, state);
    INFO((s.ok() ? std::string() : s.error()));
    REQUIRE(s.ok());

    CpuOptions co;
    co.threads = 4;
    auto onCpu = Evaluator::create(*m.forward, m.lossOutput, co);
    REQUIRE(onCpu.ok());
    CudaOptions eo = o;
    eo.collectives = "auto";
    auto onGpu = Evaluator::create(*m.forward, m.lossOutput, createCudaBackend({}, eo), "", *training);
    INFO((onGpu.ok() ? std::string() : onGpu.error()));
    REQUIRE(onGpu.ok());
    CHECK((*onGpu)->where().rfind("cuda (", 0) == 0);  // not the CPU executor
    CHECK((*onCpu)->where() == "cpu executor");
    // Sharded as the training is (tpc run's evaluator under --tp): the same ranks, each one's parameter blocks
    // copied device to device from the training backend's same blocks.
    std::unique_ptr<Evaluator> sharded;
    if (tp > 1) {
      auto ranksOf = [&](Graph& eval) -> Result<std::unique_ptr<Backend>> {
        TPC_ASSIGN(auto evalRanks, partitionRanks(eval));
        return createCudaBackend(std::move(evalRanks), o);
      };
      auto e = Evaluator::create(*m.forward, m.lossOutput, ranksOf, "megatron-tp(tp=2),dce", *training);
      INFO((e.ok() ? std::string() : e.error()));
      REQUIRE(e.ok());
      sharded = std::move(*e);
      auto block = training->deviceState("h.0.mlp.c_fc.weight", 1);  // rank 1's half of the columns
      REQUIRE(block.has_value());
      CHECK(block->layout.find("tp:S(1)") != std::string::npos);
      CHECK(block->type.numel() * tp == 64 * 256);
    }
    std::vector<double> onRanks;

    std::vector<double> gpu, cpu;
    double gpuSeconds = 0, cpuSeconds = 0;
    TrainerSettings t = test::shortRun(6, 3e-3);
    t.evalInterval = 2;
    t.evaluate = [&]() -> Result<double> {
      FixedBatches a, b;
      auto t0 = std::chrono::steady_clock::now();
      TPC_ASSIGN(double g, (*onGpu)->meanLoss(*training, a, 3));
      auto t1 = std::chrono::steady_clock::now();
      TPC_ASSIGN(double c, (*onCpu)->meanLoss(*training, b, 3));
      auto t2 = std::chrono::steady_clock::now();
      gpuSeconds += std::chrono::duration<double>(t1 - t0).count();
      cpuSeconds += std::chrono::duration<double>(t2 - t1).count();
      gpu.push_back(g);
      cpu.push_back(c);
      if (sharded) {
        FixedBatches d;
        TPC_ASSIGN(double r, sharded->meanLoss(*training, d, 3));
        onRanks.push_back(r);
      }
      return g;
    };
    FixedBatches data;
    std::ostringstream console;
    auto report = train(*training, *step, data, t, console);
    INFO(console.str() << (report.ok() ? std::string() : report.error()));
    REQUIRE(report.ok());
    REQUIRE(gpu.size() == 3);  // steps 2, 4, 6
    double worst = 0;
    for (size_t i = 0; i < gpu.size(); ++i) worst = std::max(worst, std::abs(gpu[i] - cpu[i]) / std::abs(cpu[i]));
    WARN("tp " << tp << ": valid losses (gpu) " << gpu[0] << ", " << gpu[1] << ", " << gpu[2] << "; worst relative "
               << "difference from the CPU evaluator " << worst << "; evaluation time gpu " << gpuSeconds << "s, cpu "
               << cpuSeconds << "s");
    CHECK(worst <= 1e-4);
    if (sharded) {
      REQUIRE(onRanks.size() == 3);
      double worstRanks = 0;
      for (size_t i = 0; i < onRanks.size(); ++i) worstRanks = std::max(worstRanks, std::abs(onRanks[i] - cpu[i]) / std::abs(cpu[i]));
      WARN("tp " << tp << ": sharded evaluator's valid losses " << onRanks[0] << ", " << onRanks[1] << ", " << onRanks[2]
                 << "; worst relative difference from the CPU evaluator " << worstRanks);
      CHECK(worstRanks <= 1e-4);
    }
    CHECK(gpu[2] < gpu[0]);  // the parameters are taken anew each time: training shows
  }
}

}  // namespace tpc
