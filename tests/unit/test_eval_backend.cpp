// The evaluator on a backend of its own (how `tpc run` evaluates on the GPU), checked on the CPU with a
// CpuBackend in the device's place: the same validation losses as the CPU-executor evaluator, bit for bit,
// with the parameters taken from the training backend anew at each evaluation; state writes that do not
// fit are refused.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <random>
#include <sstream>

#include "gpt_step_support.h"
#include "runtime/cpu/cpu_mesh_backend.h"
#include "runtime/evaluator.h"

namespace tpc {
namespace {

struct FixedBatches : test::LearnableBatches {
  FixedBatches() : LearnableBatches(64, 11, 5, 1) {}
};

}  // namespace

TEST_CASE("eval on a backend: equal to the CPU executor's, parameters copied at each evaluation", "[eval]") {
  GptConfig g = test::smallGpt();
  g.layers = 1;
  g.hidden = 32;
  g.vocab = 64;
  g.paddedVocab = 128;
  g.positions = 8;
  g.hiddenDropout = g.attentionDropout = 0.1;  // training draws dropout; evaluation must not
  auto m = test::gptModel(g, 2);
  std::unique_ptr<Graph> step = m.forward->clone();
  test::runPasses(*step, "autodiff(loss=" + m.lossOutput + ", clip-grad=1.0),cse,dce");
  CpuOptions co;
  co.threads = 2;
  auto training = createCpuBackend(co);
  TensorMap state;
  for (const Value* p : step->params()) state[p->name()] = initParam(*p, 3);
  REQUIRE(training->prepare(*step, state).ok());

  auto onExec = Evaluator::create(*m.forward, m.lossOutput, co);
  REQUIRE(onExec.ok());
  auto onBackend = Evaluator::create(*m.forward, m.lossOutput, createCpuBackend(co), "", *training);
  INFO((onBackend.ok() ? std::string() : onBackend.error()));
  REQUIRE(onBackend.ok());
  CHECK((*onBackend)->where() == "cpu");
  CHECK((*onExec)->where() == "cpu executor");

  std::vector<double> viaBackend, viaExec;
  TrainerSettings t = test::shortRun(6, 1e-2);
  t.evalInterval = 2;
  t.evaluate = [&]() -> Result<double> {
    FixedBatches a, b;
    TPC_ASSIGN(double x, (*onBackend)->meanLoss(*training, a, 2));
    TPC_ASSIGN(double y, (*onExec)->meanLoss(*training, b, 2));
    viaBackend.push_back(x);
    viaExec.push_back(y);
    return x;
  };
  FixedBatches data;
  std::ostringstream console;
  auto report = train(*training, *step, data, t, console);
  INFO(console.str() << (report.ok() ? std::string() : report.error()));
  REQUIRE(report.ok());
  REQUIRE(viaBackend.size() == 3);
  CHECK(viaBackend == viaExec);  // the same graph and kernels: bit for bit
  CHECK(viaBackend[2] < viaBackend[0]);  // taken anew each time, so training shows

  // In bf16, as `tpc run` evaluates a bf16 training on the GPU: the same loss to bf16's precision.
  auto bf16 = Evaluator::create(*m.forward, m.lossOutput, createCpuBackend(co), "mixed-precision(dtype=bf16),cse", *training);
  INFO((bf16.ok() ? std::string() : bf16.error()));
  REQUIRE(bf16.ok());
  FixedBatches a, b;
  auto low = (*bf16)->meanLoss(*training, a, 2), full = (*onExec)->meanLoss(*training, b, 2);
  REQUIRE(low.ok());
  REQUIRE(full.ok());
  CHECK(*low != *full);  // it did compute in bf16
  CHECK(std::abs(*low - *full) <= 2e-2 * *full);

  // With fold-vocab-padding, as tpc run's evaluation pipeline always has it: the loss reads the padded logits
  // in place, without the slice of them to the vocabulary that the graph has otherwise; the same loss.
  auto evaluatorAfter = [&](const std::string& passes, bool& slicesLogits) {
    auto e = Evaluator::create(
        *m.forward, m.lossOutput,
        [&](Graph& evaluated) -> Result<std::unique_ptr<Backend>> {
          slicesLogits = false;
          for (const Node* n : evaluated.nodeVector())
            slicesLogits |= n->op() == OpKind::Slice && n->operand(0)->shape().back() == g.paddedVocab;
          return createCpuBackend(co);
        },
        passes, *training);
    INFO(passes << ": " << (e.ok() ? std::string() : e.error()));
    REQUIRE(e.ok());
    return std::move(*e);
  };
  bool slicedBefore = false, slicedAfter = true;
  evaluatorAfter("dce", slicedBefore);
  auto folded = evaluatorAfter("dce,fold-vocab-padding", slicedAfter);
  CHECK(slicedBefore);
  CHECK_FALSE(slicedAfter);
  FixedBatches c, d;
  auto unfolded = (*onExec)->meanLoss(*training, c, 2), inPlace = folded->meanLoss(*training, d, 2);
  REQUIRE(unfolded.ok());
  REQUIRE(inPlace.ok());
  CHECK(std::abs(*inPlace - *unfolded) <= 1e-6 * *unfolded);

  // A state write names the tensor and what does not fit.
  auto other = createCpuBackend(co);
  REQUIRE(other->prepare(*step, state).ok());
  Status wrong = other->writeState("wpe", HostTensor(TensorType(DType::f32, {3})));
  REQUIRE(!wrong.ok());
  CHECK(wrong.error().find("'wpe'") != std::string::npos);
  CHECK(!other->writeState("no_such_tensor", HostTensor(TensorType(DType::f32, {3}))).ok());
}

// Evaluation sharded as a tp 2 x dp 2 training is (`tpc run` on the GPU): the forward graph through the tp
// policy and data-parallel, a backend over its four rank programs, each rank's parameter blocks taken from the
// sharded training backend. The losses equal the unsharded CPU executor's to f32 rounding (the tp sums and
// the dp mean add in another order), at every evaluation.
TEST_CASE("eval sharded as the training: tp 2 x dp 2 ranks give the unsharded evaluator's losses", "[eval]") {
  GptConfig g = test::smallGpt();
  g.layers = 1;
  g.hiddenDropout = g.attentionDropout = 0.1;
  auto m = test::gptModel(g, 4);  // the global batch of both dp ranks
  std::unique_ptr<Graph> step = m.forward->clone();
  test::runPasses(*step, test::megatronTp(2) + "autodiff(loss=" + m.lossOutput + ", clip-grad=1.0),cse,dce,data-parallel(dp=2)");
  CpuOptions co;
  co.threads = 4;
  auto training = createCpuMeshBackend(test::rankGraphs(*step), co);
  test::prepareInitialState(*training, *step, 3);

  int64_t meshRanks = 0;
  auto shardedRanks = [&](Graph& eval) -> Result<std::unique_ptr<Backend>> {
    TPC_ASSIGN(auto ranks, partitionRanks(eval));
    meshRanks = static_cast<int64_t>(ranks.size());
    return createCpuMeshBackend(std::move(ranks), co);
  };
  auto sharded = Evaluator::create(*m.forward, m.lossOutput, shardedRanks, "megatron-tp(tp=2),dce,data-parallel(dp=2)", *training);
  INFO((sharded.ok() ? std::string() : sharded.error()));
  REQUIRE(sharded.ok());
  CHECK(meshRanks == 4);
  CHECK((*sharded)->where() == "cpu (4 ranks)");
  auto whole = Evaluator::create(*m.forward, m.lossOutput, co);
  REQUIRE(whole.ok());

  std::vector<double> a, b;
  TrainerSettings t = test::shortRun(4, 1e-2);
  t.evalInterval = 2;
  t.evaluate = [&]() -> Result<double> {
    FixedBatches x, y;
    TPC_ASSIGN(double s, (*sharded)->meanLoss(*training, x, 2));
    TPC_ASSIGN(double w, (*whole)->meanLoss(*training, y, 2));
    a.push_back(s);
    b.push_back(w);
    return s;
  };
  FixedBatches data;
  std::ostringstream console;
  auto report = train(*training, *step, data, t, console);
  INFO(console.str() << (report.ok() ? std::string() : report.error()));
  REQUIRE(report.ok());
  REQUIRE(a.size() == 2);
  for (size_t i = 0; i < a.size(); ++i) CHECK(std::abs(a[i] - b[i]) <= 1e-5 * std::abs(b[i]));
  CHECK(a[1] < a[0]);  // the parameters are taken anew: training shows

  // The mesh backend's state writes: a tensor that does not fit is refused with its name and shapes; one
  // that does lands as each rank's block (read back whole).
  Status wrong = training->writeState("wpe", HostTensor(TensorType(DType::f32, {3})));
  REQUIRE(!wrong.ok());
  CHECK(wrong.error().find("'wpe'") != std::string::npos);
  CHECK(wrong.error().find("f32[3]") != std::string::npos);
  auto fc = training->readState("h.0.mlp.c_fc.weight");
  REQUIRE(fc.ok());
  HostTensor doubled = fc->clone();
  for (int64_t i = 0; i < doubled.numel(); ++i) doubled.data<float>()[i] *= 2;
  REQUIRE(training->writeState("h.0.mlp.c_fc.weight", doubled).ok());
  auto back = training->readState("h.0.mlp.c_fc.weight");
  REQUIRE(back.ok());
  CHECK(std::memcmp(back->raw(), doubled.raw(), doubled.bytes()) == 0);
}

}  // namespace tpc
