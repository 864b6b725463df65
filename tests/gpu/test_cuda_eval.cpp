// Evaluation on the GPU (tpc run --eval-interval on the CUDA backend): a tiny GPT trained on the GPU with
// an evaluation every 2 steps gets, from the evaluator on a second CudaBackend, the validation losses the
// CPU evaluator computes from the same parameters (1e-4 relative in fp32), single-rank (parameters copied
// device to device) and tp 2 on virtual ranks (unsharded: through the host; sharded as the training is: each
// rank's blocks device to device). Then the evaluator tpc run makes, which reads the training backend's
// parameter buffers instead of copying them (CudaOptions::stateSource).
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
    double worst = test::worstRelError(gpu, cpu);
    WARN("tp " << tp << ": valid losses (gpu) " << gpu[0] << ", " << gpu[1] << ", " << gpu[2] << "; worst relative "
               << "difference from the CPU evaluator " << worst << "; evaluation time gpu " << gpuSeconds << "s, cpu "
               << cpuSeconds << "s");
    CHECK(worst <= 1e-4);
    if (sharded) {
      REQUIRE(onRanks.size() == 3);
      double worstRanks = test::worstRelError(onRanks, cpu);
      WARN("tp " << tp << ": sharded evaluator's valid losses " << onRanks[0] << ", " << onRanks[1] << ", " << onRanks[2]
                 << "; worst relative difference from the CPU evaluator " << worstRanks);
      CHECK(worstRanks <= 1e-4);
    }
    CHECK(gpu[2] < gpu[0]);  // the parameters are taken anew each time: training shows
  }
}

}  // namespace tpc

namespace tpc {
namespace {

// The options of this file's backends: dropout seed 5, quiet, several ranks as virtual ranks on one GPU.
CudaOptions virtualRanks() {
  CudaOptions o;
  o.seed = 5;
  o.verbose = false;
  o.collectives = "virtual";
  return o;
}

// A CUDA backend over `step`'s ranks with `o`, prepared with initParam(3).
std::unique_ptr<Backend> preparedTraining(const Graph& step, const CudaOptions& o) {
  auto b = createCudaBackend(test::rankGraphs(step), o);
  test::prepareInitialState(*b, step, 3);
  return b;
}

// Free memory on the current GPU.
int64_t freeGpuBytes() {
  size_t freeB = 0, total = 0;
  REQUIRE(cudaMemGetInfo(&freeB, &total) == cudaSuccess);
  return static_cast<int64_t>(freeB);
}

}  // namespace

// tpc run's evaluator reads the training backend's parameter buffers (CudaOptions::stateSource) instead of
// holding a copy of the model, and runs in the training's activations arena between its steps: the same
// validation losses as an evaluator with copies and an arena of its own, bit for bit; the training's losses
// bit-identical to a run without evaluation (the evaluator wrote none of the training's parameters, and the
// training's steps do not depend on what their arena held before);
// its blocks at the training's addresses; the model's bytes less GPU memory; no way to write a borrowed block.
TEST_CASE("cuda eval: an evaluator reading the training's parameter buffers holds no copy and changes nothing",
          "[gpu][eval]") {
  test::requireGpuOrSkip();
  struct Case {
    int64_t tp;
    std::string precision;  // "" (fp32) or "mixed-precision(dtype=bf16),"
  };
  for (const Case& c : {Case{1, ""}, Case{1, "mixed-precision(dtype=bf16),"}, Case{2, "mixed-precision(dtype=bf16),"}}) {
    INFO("tp " << c.tp << " " << c.precision);
    ModelFile m = tinyGpt();
    const std::string evalPasses = test::megatronTp(c.tp) + c.precision + "cse,dce";
    std::unique_ptr<Graph> step = m.forward->clone();
    test::runPasses(*step, test::megatronTp(c.tp) + c.precision + "autodiff(loss=" + m.lossOutput + ", clip-grad=1.0),cse,dce");
    const CudaOptions o = virtualRanks();
    auto evaluator = [&](const Backend* source, const Backend& training) {
      CudaOptions eo = o;
      eo.stateSource = source;
      auto ranksOf = [&](Graph& eval) -> Result<std::unique_ptr<Backend>> {
        if (eval.mesh().empty()) return createCudaBackend({}, eo);
        TPC_ASSIGN(auto evalRanks, partitionRanks(eval));
        return createCudaBackend(std::move(evalRanks), eo);
      };
      auto e = Evaluator::create(*m.forward, m.lossOutput, ranksOf, evalPasses, training);
      INFO((e.ok() ? std::string() : e.error()));
      REQUIRE(e.ok());
      return std::move(*e);
    };

    auto plain = preparedTraining(*step, o);  // trained without evaluation
    auto training = preparedTraining(*step, o);
    std::unique_ptr<Evaluator> copying = evaluator(nullptr, *training), reading = evaluator(training.get(), *training);
    CHECK(cudaStepGraphInfo(*training)->borrowedArenas == 0);
    std::vector<double> copied, read;
    TrainerSettings t = test::shortRun(6, 3e-3);
    t.evalInterval = 2;
    t.evaluate = [&]() -> Result<double> {
      FixedBatches a, b;
      TPC_ASSIGN(double r, reading->meanLoss(*training, a, 3));
      TPC_ASSIGN(double k, copying->meanLoss(*training, b, 3));
      read.push_back(r);
      copied.push_back(k);
      return r;
    };
    FixedBatches d1, d2;
    std::ostringstream console;
    auto withEval = train(*training, *step, d1, t, console);
    INFO(console.str() << (withEval.ok() ? std::string() : withEval.error()));
    REQUIRE(withEval.ok());
    TrainerSettings noEval = test::shortRun(6, 3e-3);
    auto without = train(*plain, *step, d2, noEval, console);
    REQUIRE(without.ok());
    REQUIRE(read.size() == 3);
    CHECK(read == copied);  // bit for bit: the same parameters, the same kernels
    CHECK(read[2] < read[0]);  // each evaluation sees the training's current parameters
    CHECK(withEval->losses == without->losses);
    WARN("tp " << c.tp << " " << c.precision << ": valid losses " << read[0] << ", " << read[1] << ", " << read[2]
               << "; training losses equal to the run without evaluation: " << (withEval->losses == without->losses));
  }
}

// The same evaluators' backends directly, unsharded and tp 2 on virtual ranks: where each rank's block lives,
// the memory, the loss and the refusals.
TEST_CASE("cuda eval: a backend reading another's parameters uses its buffers and refuses to write them", "[gpu][eval]") {
  test::requireGpuOrSkip();
  // A vocabulary large enough that the parameters (about 18M, 72 MiB in f32) stand out of the allocations'
  // granularity in cudaMemGetInfo.
  GptConfig g = test::smallGpt();
  g.hidden = 256;
  g.heads = 4;
  g.vocab = 65536;
  g.paddedVocab = 65536;
  ModelFile m = test::gptModel(g, 2);
  for (int64_t tp : {1, 2}) {
    INFO("tp " << tp);
    std::unique_ptr<Graph> step = m.forward->clone();
    test::runPasses(*step, test::megatronTp(tp) + "mixed-precision(dtype=bf16),autodiff(loss=" + m.lossOutput +
                               ", clip-grad=1.0),cse,dce");
    const CudaOptions o = virtualRanks();
    auto training = preparedTraining(*step, o);
    std::unique_ptr<Graph> eval = m.forward->clone();
    test::runPasses(*eval, "inference," + test::megatronTp(tp) + "mixed-precision(dtype=bf16),cse,dce,fold-vocab-padding");
    int64_t paramBytes = 0;
    TensorMap zeros;
    for (const Value* p : eval->params()) {
      paramBytes += p->type().bytes();
      zeros[p->name()] = HostTensor(p->type());
    }
    auto prepared = [&](const Backend* source) {
      CudaOptions eo = o;
      eo.stateSource = source;
      auto b = createCudaBackend(test::rankGraphs(*eval), eo);
      Status st = b->prepare(*eval, zeros);
      INFO((st.ok() ? std::string() : st.error()));
      REQUIRE(st.ok());
      return b;
    };
    auto warm = prepared(nullptr);  // the first backend's one-time allocations (libraries, modules) out of the way
    int64_t before = freeGpuBytes();
    auto copying = prepared(nullptr);
    int64_t copyingBytes = before - freeGpuBytes();
    before = freeGpuBytes();
    auto reading = prepared(training.get());
    int64_t readingBytes = before - freeGpuBytes();
    WARN("tp " << tp << ": parameters " << paramBytes / 1048576.0 << " MiB; GPU memory of a backend with its own copy "
               << copyingBytes / 1048576.0 << " MiB, reading the training's " << readingBytes / 1048576.0 << " MiB");
    CHECK(copyingBytes - readingBytes >= paramBytes * 9 / 10);
    // Its activations arena is the training's too (the training's is larger: it holds the backward).
    auto readingInfo = cudaStepGraphInfo(*reading), copyingInfo = cudaStepGraphInfo(*copying);
    REQUIRE(readingInfo.has_value());
    REQUIRE(copyingInfo.has_value());
    CHECK(readingInfo->borrowedArenas == tp);
    CHECK(readingInfo->borrowedParams == tp * static_cast<int64_t>(eval->params().size()));
    CHECK(copyingInfo->borrowedArenas == 0);
    CHECK(copyingInfo->borrowedParams == 0);

    for (const Value* p : eval->params()) {
      for (int64_t rank = 0; rank < tp; ++rank) {
        INFO(p->name() << " rank " << rank);
        auto mine = reading->deviceState(p->name(), rank), theirs = training->deviceState(p->name(), rank);
        REQUIRE(mine.has_value());
        REQUIRE(theirs.has_value());
        CHECK(mine->data == theirs->data);
        CHECK(copying->deviceState(p->name(), rank)->data != theirs->data);
      }
      CHECK(reading->copyStateFrom(*training, p->name()).ok());  // nothing to copy: the same memory
    }
    if (tp > 1) CHECK(training->deviceState("h.0.mlp.c_fc.weight", 1)->layout.find("tp:S(1)") != std::string::npos);
    // The loss with the training's parameters, read in place and copied: the same bits.
    FixedBatches batches;
    TensorMap in;
    for (const Value* v : eval->inputs()) in[v->name()] = HostTensor(v->type());
    REQUIRE(batches.next(in["tokens"].data<int32_t>(), in["targets"].data<int32_t>(), 2, g.positions).ok());
    for (const Value* p : eval->params()) REQUIRE(copying->copyStateFrom(*training, p->name()).ok());
    auto a = reading->step(in, 1), b = copying->step(in, 1);
    REQUIRE(a.ok());
    REQUIRE(b.ok());
    CHECK(a->at(m.lossOutput).getAsDouble(0) == b->at(m.lossOutput).getAsDouble(0));
    CHECK(std::isfinite(a->at(m.lossOutput).getAsDouble(0)));

    const std::string name = eval->params()[0]->name();
    Status w = reading->writeState(name, HostTensor(eval->params()[0]->type()));
    CHECK_FALSE(w.ok());
    CHECK(w.error().find("cannot be written here") != std::string::npos);
    Status c = reading->copyStateFrom(*copying, name);
    CHECK_FALSE(c.ok());
    CHECK(c.error().find(name) != std::string::npos);
  }
}

}  // namespace tpc
