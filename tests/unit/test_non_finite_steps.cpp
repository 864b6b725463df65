// Non-finite steps (tpc run --on-nan, backend.h): a step whose loss or gradient norm is a NaN leaves the
// state bit for bit as it was, on one rank and on a mesh; re-run in checking mode it names the first
// non-finite value in execution order; the trainer skips it or stops naming the step and that value.
// The NaN is injected into one value of the step with the executor's test-only faults (CpuFaults).
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <random>
#include <sstream>

#include "gpt_step_support.h"
#include "ir/printer.h"
#include "runtime/cpu/test_faults.h"
#include "runtime/trainer.h"

namespace tpc {
namespace {

// A 1-layer GPT training step (autodiff + clipping + AdamW), annotated for tp when tp > 1.
std::unique_ptr<Graph> stepGraph(int64_t tp) {
  GptConfig g = test::smallGpt();
  g.layers = 1;
  g.hidden = 32;
  g.heads = 2;
  g.vocab = 64;
  g.positions = 8;
  return test::gptStep(g, 2, test::megatronTp(tp) + test::kTrainPasses);
}

std::unique_ptr<Backend> makeBackend(const Graph& step, CpuFaults faults) {
  CpuOptions o;
  o.threads = 1;
  o.faults = std::move(faults);
  return test::preparedCpuBackend(step, o, 3);
}

TensorMap batch(int64_t stepIndex) {
  std::mt19937 rng(static_cast<unsigned>(stepIndex));
  return test::gptBatch(rng, {2, 8}, 64, 1e-2f, stepIndex);
}


// The first matmul of the forward pass: its result is where the test puts the NaN.
std::pair<std::string, int64_t> firstMatmul(const Graph& g) {
  ValueNames names(g);
  int64_t index = 0;
  for (const Node* n : g.nodes()) {
    if (n->op() == OpKind::Matmul) return {names(n->result()), index};
    ++index;
  }
  FAIL("no matmul in the step");
  return {};
}

bool finiteScalar(const TensorMap& out, const char* name) { return std::isfinite(out.at(name).getAsDouble(0)); }

TEST_CASE("non-finite step: the state is kept and checking mode names the injected value", "[cpu][nonfinite]") {
  auto step = stepGraph(1);
  auto [value, index] = firstMatmul(*step);
  CpuFaults faults;
  faults.step = 2;
  faults.nanValue = value;
  auto b = makeBackend(*step, faults);

  auto before = test::stateBytes(*b, *step);
  auto out1 = b->step(batch(1), 1);
  REQUIRE(out1.ok());
  CHECK(finiteScalar(*out1, "loss"));
  auto after1 = test::stateBytes(*b, *step);
  CHECK(after1 != before);  // a finite step updates the state
  auto clean = b->findFirstNonFinite(batch(1), 1);
  REQUIRE(clean.ok());
  CHECK(!clean->has_value());

  auto out2 = b->step(batch(2), 2);
  REQUIRE(out2.ok());
  CHECK(!finiteScalar(*out2, "loss"));
  CHECK(isNonFiniteStep(*out2));
  CHECK(test::stateBytes(*b, *step) == after1);  // parameters and Adam moments untouched, bit for bit

  auto first = b->findFirstNonFinite(batch(2), 2);
  REQUIRE(first.ok());
  REQUIRE(first->has_value());
  const NonFiniteValue& f = **first;
  CHECK(f.value == value);
  CHECK(f.index == index);
  CHECK(f.rank == -1);
  CHECK(f.element == 0);
  CHECK(std::isnan(f.sample));
  CHECK(f.node.rfind(value + " = matmul(", 0) == 0);
  CHECK(f.describe().find("(node " + std::to_string(index + 1) + " of ") != std::string::npos);
  CHECK(test::stateBytes(*b, *step) == after1);  // checking mode commits nothing either

  auto out3 = b->step(batch(3), 3);
  REQUIRE(out3.ok());
  CHECK(finiteScalar(*out3, "loss"));
  CHECK(test::stateBytes(*b, *step) != after1);
}

TEST_CASE("non-finite step: a mesh keeps every rank's state and names the rank", "[cpu][nonfinite][mesh]") {
  auto step = stepGraph(2);
  // A gradient that exists on both ranks under its own name (tp splits it, the name stays).
  std::string grad = "%d.wpe";
  CpuFaults faults;
  faults.step = 2;
  faults.nanValue = grad;
  auto b = makeBackend(*step, faults);
  REQUIRE(b->step(batch(1), 1).ok());
  auto after1 = test::stateBytes(*b, *step);
  auto out2 = b->step(batch(2), 2);
  REQUIRE(out2.ok());
  CHECK(finiteScalar(*out2, "loss"));  // the forward pass is clean, the gradient is not
  CHECK(!finiteScalar(*out2, "grad_norm"));
  CHECK(test::stateBytes(*b, *step) == after1);
  auto first = b->findFirstNonFinite(batch(2), 2);
  REQUIRE(first.ok());
  REQUIRE(first->has_value());
  CHECK((*first)->value == grad);
  // The earliest in execution order (each rank's own program), then the lowest rank: the rank programs differ
  // (rank 0 alone adds the replicated values to the partial sums), so the position is looked up in each.
  int64_t wantRank = -1, wantIndex = -1;
  auto ranks = test::rankGraphs(*step);
  for (size_t r = 0; r < ranks.size(); ++r) {
    ValueNames names(*ranks[r]);
    int64_t index = 0;
    for (const Node* n : ranks[r]->nodes()) {
      bool here = false;
      for (const Value* v : n->results()) here |= names(v) == grad;
      if (here) break;
      ++index;
    }
    REQUIRE(index < static_cast<int64_t>(ranks[r]->numNodes()));
    if (wantRank < 0 || index < wantIndex) wantRank = static_cast<int64_t>(r), wantIndex = index;
  }
  CHECK((*first)->rank == wantRank);
  CHECK((*first)->index == wantIndex);
  CHECK((*first)->describe().find(" on rank " + std::to_string(wantRank) + ": nan at element 0") != std::string::npos);
}

// Random windows from a fixed generator.
class RandomBatches final : public BatchSource {
 public:
  Status next(int32_t* tokens, int32_t* targets, int64_t rows, int64_t seq) override {
    for (int64_t i = 0; i < rows * seq; ++i) {
      tokens[i] = static_cast<int32_t>(rng_() % 64);
      targets[i] = static_cast<int32_t>(rng_() % 64);
    }
    return {};
  }

 private:
  std::mt19937 rng_{5};
};

// 5 steps logged each, lr 1e-2 decaying to 1e-3 over them after `warmup` steps.
TrainerSettings fiveSteps(int64_t warmup) {
  TrainerSettings s;
  s.trainIters = 5;
  s.logInterval = 1;
  s.lr.maxLr = 1e-2;
  s.lr.minLr = 1e-3;
  s.lr.warmupIters = warmup;
  s.lr.decayIters = 5;
  return s;
}

TEST_CASE("trainer: --on-nan skip drops the step and goes on, stop names the step and the value", "[cpu][nonfinite][trainer]") {
  auto step = stepGraph(1);
  auto [value, index] = firstMatmul(*step);
  CpuFaults faults;
  faults.step = 3;
  faults.nanValue = value;
  TrainerSettings s = fiveSteps(0);

  SECTION("skip") {
    auto b = makeBackend(*step, faults);
    RandomBatches data;
    s.onNonFinite = OnNonFinite::Skip;
    std::ostringstream console;
    auto report = train(*b, *step, data, s, console);
    INFO(console.str() << (report.ok() ? std::string() : report.error()));
    REQUIRE(report.ok());
    CHECK(report->skippedSteps == std::vector<int64_t>{3});
    CHECK(report->losses.size() == 4);
    for (double l : report->losses) CHECK(std::isfinite(l));
    CHECK(console.str().find("step      3/5 | skipped: loss nan") != std::string::npos);
    CHECK(console.str().find("step      5/5 | loss ") != std::string::npos);
  }
  SECTION("stop") {
    auto b = makeBackend(*step, faults);
    RandomBatches data;
    std::ostringstream console;
    auto report = train(*b, *step, data, s, console);
    REQUIRE(!report.ok());
    INFO(report.error());
    CHECK(report.error().rfind("step 3: the loss is nan", 0) == 0);
    CHECK(report.error().find("the first non-finite value of the step is " + value + " = matmul(") != std::string::npos);
    CHECK(report.error().find("(node " + std::to_string(index + 1) + " of ") != std::string::npos);
  }
  SECTION("every step skipped is an error") {
    CpuFaults always;
    always.step = -1;
    auto b = makeBackend(*step, always);
    // A final layer-norm gain that is NaN from the start makes every step non-finite.
    TensorMap state;
    for (const Value* p : step->params()) state[p->name()] = initParam(*p, 3);
    REQUIRE(state.count("ln_f.weight"));
    state["ln_f.weight"].data<float>()[0] = NAN;
    REQUIRE(b->prepare(*step, state).ok());
    RandomBatches data;
    s.onNonFinite = OnNonFinite::Skip;
    std::ostringstream console;
    auto report = train(*b, *step, data, s, console);
    REQUIRE(!report.ok());
    CHECK(report.error().find("every one of the 5 steps") == 0);
  }
}

// The lr and Adam step each step is given, around a real backend.
class LrRecorder final : public Backend {
 public:
  explicit LrRecorder(std::unique_ptr<Backend> inner) : inner_(std::move(inner)) {}
  std::string name() const override { return inner_->name(); }
  Status prepare(const Graph& g, const TensorMap& s) override { return inner_->prepare(g, s); }
  Result<TensorMap> step(const TensorMap& in, int64_t i) override {
    lrs.push_back(in.at("lr").data<float>()[0]);
    adamSteps.push_back(in.at("step").data<float>()[0]);
    return inner_->step(in, i);
  }
  Result<HostTensor> readState(const std::string& n) const override { return inner_->readState(n); }
  std::vector<float> lrs, adamSteps;

 private:
  std::unique_ptr<Backend> inner_;
};

// Megatron-LM's OptimizerParamScheduler: created at num_steps 0 and stepped after each applied update, so step N trains
// with get_lr(N - 1 - skipped) and its log shows the lr after the step (param_group['lr'] once the scheduler stepped).
TEST_CASE("trainer: the lr schedule counts applied updates, as Megatron-LM's scheduler, and a skipped step does not advance it",
          "[cpu][nonfinite][trainer]") {
  auto step = stepGraph(1);
  auto [value, index] = firstMatmul(*step);
  CpuFaults faults;
  faults.step = 2;
  faults.nanValue = value;
  TrainerSettings s = fiveSteps(2);
  s.lr.style = "linear";
  s.onNonFinite = OnNonFinite::Skip;
  LrRecorder b(makeBackend(*step, faults));
  RandomBatches data;
  std::ostringstream console;
  auto report = train(b, *step, data, s, console);
  INFO(console.str() << (report.ok() ? std::string() : report.error()));
  REQUIRE(report.ok());
  CHECK(report->skippedSteps == std::vector<int64_t>{2});
  // Updates applied before steps 1-5: 0, 1, 1 (step 2 skipped), 2, 3. Warmup 2 to 1e-2, then linear to 1e-3 at 5.
  const std::vector<float> want = {0.0f, 5e-3f, 5e-3f, 1e-2f, static_cast<float>(1e-3 + (1e-2 - 1e-3) * 2.0 / 3.0)};
  REQUIRE(b.lrs.size() == want.size());
  for (size_t i = 0; i < want.size(); ++i) CHECK(b.lrs[i] == Approx(want[i]).margin(1e-9));
  CHECK(b.adamSteps == std::vector<float>{1, 2, 2, 3, 4});
  // Logged: the lr after each step (a skipped one keeps the lr it had).
  const std::string out = console.str();
  CHECK(out.find("step      1/5 | loss ") != std::string::npos);
  CHECK(out.find("| lr 5.000e-03 |") != std::string::npos);
  CHECK(out.find("step      4/5 | loss ") != std::string::npos);
  CHECK(out.find("step      5/5 | loss ") != std::string::npos);
  CHECK(out.find("| lr 4.000e-03 |") != std::string::npos);  // after step 5: 4 updates, 2/3 of the decay done
}

TEST_CASE("TPC_TEST_FAULT: the fault spec parses, and a bad one is an error", "[cpu][nonfinite]") {
  auto a = cpu::parseTestFaults("step=3,nan=%d.wte");
  REQUIRE(a.ok());
  CHECK(a->step == 3);
  CHECK(a->nanValue == "%d.wte");
  CHECK(a->stallRank == -1);
  CHECK(a->nanRank == -1);
  auto c = cpu::parseTestFaults("step=3,nan=%1,nan-rank=1");
  REQUIRE(c.ok());
  CHECK(c->nanRank == 1);
  auto b = cpu::parseTestFaults("step=2,stall-rank=1");
  REQUIRE(b.ok());
  CHECK(b->stallRank == 1);
  for (const char* bad : {"", "step=2", "nan=%x", "step=x,nan=%x", "step=1,nan=x", "step=1,stall-rank=-1", "step=1,boom=2",
                          "step=1,nan=%x,nan-rank=x"})
    CHECK(!cpu::parseTestFaults(bad).ok());
  CHECK(parseOnNonFinite("skip").ok());
  CHECK(!parseOnNonFinite("ignore").ok());
  // A fault naming a value the graph lacks is refused at prepare, not ignored.
  Graph g("g");
  g.addInput("x", TensorType(DType::f32, {2}));
  g.addOutput(g.inputs()[0], "y");
  CpuOptions o;
  o.faults.step = 1;
  o.faults.nanValue = "%nope";
  auto backend = createCpuBackend(o);
  Status st = backend->prepare(g, {});
  REQUIRE(!st.ok());
  CHECK(st.error().find("%nope") != std::string::npos);
}

}  // namespace
}  // namespace tpc
