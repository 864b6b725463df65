// fp16 with dynamic loss scaling (issue 6): the step graph's %loss_scale seeds the backward and the
// gradients are unscaled before clipping and AdamW; the trainer skips an overflowed step (state bit for bit
// unchanged, Adam's step not advanced), halves the scale, doubles it after a window of good steps, and
// fails below the minimum; `tpc run --precision fp16` logs the scale and a resumed run keeps it.
#include <catch2/catch.hpp>

#include <cmath>
#include <filesystem>
#include <random>
#include <sstream>

#include "gpt_step_support.h"
#include "runtime/checkpoint.h"
#include "runtime/trainer.h"
#include "test_support.h"
#include "worst_error.h"
#ifdef TPC_HAVE_CUDA
#include <set>

#include "runtime/cuda/lowering.h"
#include "runtime/cuda/nvrtc_compiler.h"
#endif

namespace tpc {
namespace {

// A 2-layer GPT training step; `pre` runs before autodiff, `autodiffOptions` are appended to its own.
std::unique_ptr<Graph> stepGraph(const std::string& pre, const std::string& autodiffOptions) {
  return test::gptStep(test::smallGpt(), 4, pre + "autodiff(clip-grad=1.0, weight-decay=0.1" + autodiffOptions + "),cse,dce");
}

std::unique_ptr<Backend> prepared(const Graph& g) {
  CpuOptions o;
  o.threads = 2;
  return test::preparedCpuBackend(g, o, 1);
}

// Learnable batches: predict the token itself.
struct EchoBatches : test::LearnableBatches {
  EchoBatches() : LearnableBatches(20, 3) {}
};

// Records what the trainer gives every step (Adam's step, the loss scale), whether the step was
// non-finite and whether it changed the state, then runs it on the real backend.
class RecordingBackend final : public Backend {
 public:
  RecordingBackend(std::unique_ptr<Backend> inner, const Graph& g) : inner_(std::move(inner)), g_(g) {}
  std::string name() const override { return inner_->name(); }
  Status prepare(const Graph& g, const TensorMap& s) override { return inner_->prepare(g, s); }
  Result<TensorMap> step(const TensorMap& in, int64_t i) override {
    adamSteps.push_back(in.at("step").getAsDouble(0));
    scales.push_back(in.count("loss_scale") ? in.at("loss_scale").getAsDouble(0) : 0);
    std::string before = state();
    auto out = inner_->step(in, i);
    if (out.ok()) {
      nonFinite.push_back(isNonFiniteStep(*out));
      stateChanged.push_back(state() != before);
    }
    return out;
  }
  Result<HostTensor> readState(const std::string& n) const override { return inner_->readState(n); }
  std::vector<double> adamSteps, scales;
  std::vector<bool> nonFinite, stateChanged;

 private:
  std::string state() const {
    std::string all;
    for (const Value* p : g_.params()) {
      auto t = inner_->readState(p->name());
      if (t.ok()) all.append(reinterpret_cast<const char*>(t->raw()), t->bytes());
    }
    return all;
  }
  std::unique_ptr<Backend> inner_;
  const Graph& g_;
};

TrainerSettings settings(int64_t iters) {
  TrainerSettings s;
  s.trainIters = iters;
  s.logInterval = 1;
  s.lr.maxLr = 3e-3;
  s.lr.minLr = 3e-3;
  s.lr.warmupIters = 0;
  s.lr.decayIters = iters;
  return s;
}

Result<TrainReport> trainOn(Backend& b, const Graph& g, TrainerSettings s, std::string* log = nullptr) {
  EchoBatches data;
  std::ostringstream console;
  auto r = train(b, g, data, s, console);
  if (log) *log = console.str();
  return r;
}

// EchoBatches' first batch as a step's inputs (lr 3e-3, step 1).
TensorMap firstBatch() {
  EchoBatches data;
  TensorMap in;
  HostTensor tokens(TensorType(DType::i32, {4, 16})), targets(TensorType(DType::i32, {4, 16}));
  REQUIRE(data.next(tokens.data<int32_t>(), targets.data<int32_t>(), 4, 16).ok());
  in["tokens"] = tokens;
  in["targets"] = targets;
  in["lr"] = HostTensor::scalarF32(3e-3f);
  in["step"] = HostTensor::scalarF32(1);
  return in;
}

}  // namespace

TEST_CASE("loss scaling: the scale seeds the backward and the gradients come back unscaled", "[precision][fp16]") {
  auto plain = stepGraph("", "");
  auto scaled = stepGraph("", ", loss-scale=true");
  bool hasInput = false;
  for (const Value* v : scaled->inputs()) hasInput |= v->name() == "loss_scale" && v->type().str() == "f32[]";
  CHECK(hasInput);
  auto a = prepared(*plain);
  auto b = prepared(*scaled);
  TensorMap in = firstBatch();
  auto outA = a->step(in, 1);
  in["loss_scale"] = HostTensor::scalarF32(1024);  // a power of two: in fp32 scaling and unscaling are exact
  auto outB = b->step(in, 1);
  REQUIRE(outA.ok());
  REQUIRE(outB.ok());
  CHECK(outB->at("loss").getAsDouble(0) == outA->at("loss").getAsDouble(0));  // the loss itself is never scaled
  double na = outA->at("grad_norm").getAsDouble(0), nb = outB->at("grad_norm").getAsDouble(0);
  CHECK(std::abs(nb - na) <= 1e-6 * na);
  auto wa = a->readState("h.0.mlp.c_fc.weight"), wb = b->readState("h.0.mlp.c_fc.weight");
  REQUIRE(wa.ok());
  REQUIRE(wb.ok());
  double worst = test::worstAbsError(*wa, *wb);
  CHECK(worst <= 1e-7);
}

TEST_CASE("loss scaling: fp16 training on the CPU follows fp32 within fp16 noise", "[precision][fp16]") {
  auto f32 = stepGraph("", "");
  auto f16 = stepGraph("mixed-precision(dtype=f16),", ", loss-scale=true");
  int f16Matmuls = 0;
  for (const Node* n : f16->nodes()) f16Matmuls += n->op() == OpKind::Matmul && n->operand(0)->dtype() == DType::f16;
  CHECK(f16Matmuls > 0);
  auto a = prepared(*f32);
  auto b = prepared(*f16);
  auto s = settings(8);
  auto ra = trainOn(*a, *f32, s);
  s.lossScaling = LossScaleSettings{};  // 65536, window 1000, min 1
  auto rb = trainOn(*b, *f16, s);
  REQUIRE(ra.ok());
  INFO((rb.ok() ? std::string() : rb.error()));
  REQUIRE(rb.ok());
  REQUIRE(ra->losses.size() == 8);
  REQUIRE(rb->losses.size() == 8);  // 65536 does not overflow this model
  CHECK(rb->skippedSteps.empty());
  CHECK(rb->end.lossScale == 65536);
  CHECK(rb->end.lossScaleGoodSteps == 8);
  double worst = test::worstRelError(rb->losses, ra->losses), any = test::worstAbsError(rb->losses, ra->losses);
  WARN("fp16 (loss scale 65536) vs fp32 losses over 8 steps: worst relative difference " << worst << "; fp32 "
       << ra->losses.front() << " -> " << ra->losses.back() << ", fp16 " << rb->losses.front() << " -> " << rb->losses.back());
  CHECK(worst <= 5e-3);  // fp16 keeps 11 bits (bf16 8, whose test allows 2e-2)
  CHECK(any > 0);        // fp16 rounding really happened
  CHECK(rb->losses.back() < 0.8 * rb->losses.front());
}

TEST_CASE("loss scaling: an overflow skips the step with the state untouched, the second halves the scale", "[precision][fp16]") {
  auto g = stepGraph("mixed-precision(dtype=f16),", ", loss-scale=true");
  SECTION("one step at an overflowing scale leaves parameters and moments bit-identical") {
    auto b = prepared(*g);
    TensorMap in = firstBatch();
    in["loss_scale"] = HostTensor::scalarF32(std::ldexp(1.0f, 40));  // dlogits ~ 2^40 / 64 overflow fp16
    auto before = test::stateBytes(*b, *g);
    auto out = b->step(in, 1);
    REQUIRE(out.ok());
    CHECK(std::isfinite(out->at("loss").getAsDouble(0)));  // the forward is fine: only the gradients overflow
    CHECK(!std::isfinite(out->at("grad_norm").getAsDouble(0)));
    CHECK(test::stateBytes(*b, *g) == before);
    in["loss_scale"] = HostTensor::scalarF32(1024);
    out = b->step(in, 1);
    REQUIRE(out.ok());
    CHECK(std::isfinite(out->at("grad_norm").getAsDouble(0)));
    CHECK(test::stateBytes(*b, *g) != before);
  }
  SECTION("the trainer skips overflowed steps, halves (hysteresis 2) and doubles the scale, Adam counts applied updates") {
    RecordingBackend b(prepared(*g), *g);
    auto s = settings(30);
    s.lossScaling = LossScaleSettings{std::ldexp(1.0, 40), 4, 1};
    std::string log;
    auto r = trainOn(b, *g, s, &log);
    INFO(log << (r.ok() ? std::string() : r.error()));
    REQUIRE(r.ok());
    REQUIRE(b.nonFinite.size() == 30);
    // The rules, replayed on what each step did (Megatron-LM's DynamicGradScaler): halve on an overflow once two have
    // come since the scale last doubled, double after 4 good steps in a row.
    double scale = std::ldexp(1.0, 40);
    int64_t good = 0, applied = 0, left = 2;
    std::vector<int64_t> skipped;
    for (size_t i = 0; i < 30; ++i) {
      INFO("step " << i + 1);
      CHECK(b.scales[i] == scale);
      CHECK(b.adamSteps[i] == static_cast<double>(applied + 1));  // skipped steps do not advance Adam's step
      CHECK(b.stateChanged[i] == !b.nonFinite[i]);                 // an overflowed step leaves the state as it was
      if (b.nonFinite[i]) {
        skipped.push_back(static_cast<int64_t>(i + 1));
        left = std::max<int64_t>(left - 1, 0);
        if (left == 0) scale /= 2;
        good = 0;
      } else {
        ++applied;
        if (++good == 4) scale *= 2, good = 0, left = 2;
      }
    }
    CHECK(r->skippedSteps == skipped);
    CHECK(r->end.lossScale == scale);
    CHECK(r->end.lossScaleGoodSteps == good);
    CHECK(r->end.skippedSteps == static_cast<int64_t>(skipped.size()));
    // 2^40 overflows from the start; the scale comes down to where the fp16 gradients fit, and training goes on.
    CHECK(b.nonFinite[0]);
    CHECK(skipped.size() >= 10);
    CHECK(applied >= 5);
    CHECK(log.find("step      1/30 | skipped: loss ") != std::string::npos);
    CHECK(log.find("step      1/30 | skipped: loss ") != std::string::npos);
    CHECK(log.find("(gradient overflow at loss scale 1.09951e+12; scale kept, --hysteresis: 1 more overflow before it is "
                   "halved, parameters and optimizer state kept)") != std::string::npos);
    CHECK(log.find("(gradient overflow at loss scale 1.09951e+12; scale lowered to 5.49756e+11") != std::string::npos);
    CHECK(r->end.lossScaleHysteresisLeft == left);
    CHECK(log.find("| loss scale ") != std::string::npos);
  }
  SECTION("below the minimum scale the run stops naming the step, the scale and the first non-finite value") {
    auto b = prepared(*g);
    auto s = settings(30);
    s.lossScaling = LossScaleSettings{std::ldexp(1.0, 40), 1000, std::ldexp(1.0, 38)};
    auto r = trainOn(*b, *g, s);
    REQUIRE(!r.ok());
    INFO(r.error());
    // Step 1 keeps 2^40 (hysteresis), 2 and 3 halve it to 2^38, 4 would go below.
    CHECK(r.error().rfind("step 4: the gradients are not finite at loss scale 2.74878e+11, and halving it would go below "
                          "--min-loss-scale=2.74878e+11", 0) == 0);
    CHECK(r.error().find("the first non-finite value of the step is %") != std::string::npos);
  }
}

TEST_CASE("loss scaling: bad settings are refused naming the flag", "[precision][fp16]") {
  CHECK(LossScaleSettings{65536, 1000, 1}.validate().ok());
  CHECK(LossScaleSettings{0.5, 1000, 1}.validate().error().find("--initial-loss-scale=0.5 must be at least") == 0);
  CHECK(LossScaleSettings{65536, 0, 1}.validate().error().find("--loss-scale-window=0 must be at least 1") == 0);
  CHECK(LossScaleSettings{65536, 1000, 0}.validate().error().find("--min-loss-scale=0 must be a positive") == 0);
  CHECK(LossScaleSettings{65536, 1000, 1, 0}.validate().error().find("--hysteresis=0 must be at least 1") == 0);
  DynamicLossScaler s(LossScaleSettings{8, 2, 2, 1});  // hysteresis 1: every overflow halves
  CHECK(s.update(true, 1).ok());
  CHECK(s.scale() == 8);
  CHECK(s.update(true, 2).ok());
  CHECK(s.scale() == 16);  // a full window doubles
  CHECK(s.update(false, 3).ok());
  CHECK(s.scale() == 8);
  CHECK(s.update(false, 4).ok());
  CHECK(s.update(false, 5).ok());
  CHECK(s.scale() == 2);
  CHECK(!s.update(false, 6).ok());  // 1 < min 2
  // Hysteresis 3: the third overflow since the scale last doubled halves it, and every one after; a doubling
  // restores the count, good steps alone do not (as Megatron-LM's DynamicGradScaler).
  DynamicLossScaler h(LossScaleSettings{64, 2, 1, 3});
  for (bool finite : {false, true, false}) CHECK(h.update(finite, 1).ok());
  CHECK(h.scale() == 64);
  CHECK(h.hysteresisLeft() == 1);
  CHECK(h.update(false, 2).ok());
  CHECK(h.scale() == 32);
  CHECK(h.update(false, 3).ok());
  CHECK(h.scale() == 16);
  CHECK(h.update(true, 4).ok());
  CHECK(h.update(true, 5).ok());
  CHECK(h.scale() == 32);
  CHECK(h.hysteresisLeft() == 3);
  // A resumed scaler takes the saved count, at most the settings' hysteresis.
  CHECK(DynamicLossScaler(LossScaleSettings{64, 2, 1, 3}, 64, 0, 1).hysteresisLeft() == 1);
  CHECK(DynamicLossScaler(LossScaleSettings{64, 2, 1, 2}, 64, 0, 5).hysteresisLeft() == 2);
}

TEST_CASE("tpc run --precision fp16: the loss scale in the logs and the checkpoint, kept by a resumed run",
          "[precision][fp16][checkpoint][cli]") {
  test::TempDir dir;
  const std::string d = dir.path.string();
  const std::string fp16 = "--precision fp16 --initial-loss-scale 1024 --loss-scale-window 2 ";
  auto full = test::runTiny(fp16 + "--train-iters 5 --log-jsonl " + d + "/full.jsonl");
  REQUIRE(full.exitCode == 0);
  CHECK(full.out.find("precision fp16: dynamic loss scale 1024 (doubled after 2 finite steps") != std::string::npos);
  CHECK(full.out.find("| loss scale 2048") != std::string::npos);
  auto first = test::runTiny(fp16 + "--train-iters 3 --save " + d + "/ck --log-jsonl " + d + "/part.jsonl");
  REQUIRE(first.exitCode == 0);
  auto state = parseCheckpointState(test::readFile(d + "/ck/iter_0000003/state.json"), "state.json");
  REQUIRE(state.ok());
  CHECK(state->lossScale == 2048);  // doubled after steps 1-2
  CHECK(state->lossScaleGoodSteps == 1);
  CHECK(state->lossScaleHysteresisLeft == 2);
  CHECK(full.out.find("halved from the 2nd overflow since it last doubled, minimum 1)") != std::string::npos);
  CHECK(state->skippedSteps == 0);
  // Resumed with another --initial-loss-scale: the checkpoint's scale wins.
  auto second = test::runTiny("--precision fp16 --initial-loss-scale 8 --loss-scale-window 2 --train-iters 5 --load " +
                              d + "/ck --log-jsonl " + d + "/part.jsonl");
  REQUIRE(second.exitCode == 0);
  std::string a = test::readFile(d + "/full.jsonl"), b = test::readFile(d + "/part.jsonl");
  CHECK(test::jsonlField(a, "loss_scale") == std::vector<double>{1024, 2048, 2048, 4096, 4096});
  CHECK(test::jsonlField(b, "loss_scale") == test::jsonlField(a, "loss_scale"));
  CHECK(test::jsonlField(b, "loss") == test::jsonlField(a, "loss"));  // and the resumed losses are bit-identical
  REQUIRE(test::jsonlField(a, "loss").size() == 5);

  auto bf16Flag = test::runTiny("--precision bf16 --loss-scale-window 10 --train-iters 1");
  CHECK(bf16Flag.exitCode == 1);
  CHECK(bf16Flag.err.find("--loss-scale-window applies to --precision fp16 only") != std::string::npos);
  auto bf16Hysteresis = test::runTiny("--precision bf16 --hysteresis 1 --train-iters 1");
  CHECK(bf16Hysteresis.exitCode == 1);
  CHECK(bf16Hysteresis.err.find("--hysteresis applies to --precision fp16 only") != std::string::npos);
  auto noHysteresis = test::runTiny("--precision fp16 --hysteresis 0 --train-iters 1");
  CHECK(noHysteresis.exitCode == 1);
  CHECK(noHysteresis.err.find("--hysteresis") != std::string::npos);
  auto badScale = test::runTiny("--precision fp16 --initial-loss-scale 0.5 --train-iters 1");
  CHECK(badScale.exitCode == 1);
  CHECK(badScale.err.find("--initial-loss-scale=0.5 must be at least --min-loss-scale=1") != std::string::npos);
}

#ifdef TPC_HAVE_CUDA
// No GPU needed: what the CUDA backend would run for an fp16 step with loss scaling (the GPU test in
// tests/gpu/test_cuda_nonfinite.cpp trains it).
TEST_CASE("loss scaling: every node of an fp16 training step lowers for CUDA and its kernels compile for sm_90",
          "[cuda][fp16]") {
  auto g = stepGraph("mixed-precision(dtype=f16),", ", loss-scale=true");
  test::TempDir cache;
  cuda::NvrtcCompiler nvrtc(90, cache.path.string());
  cuda::LoweringContext ctx;
  std::set<std::string> sources;
  std::vector<std::string> failed;
  int kernels = 0, f16Nodes = 0;
  for (const Node* n : g->nodes()) {
    for (const Value* v : n->results()) f16Nodes += v->dtype() == DType::f16;
    if (cuda::nodeExec(*n) != cuda::NodeExec::Kernels) continue;
    auto l = cuda::lowerNode(*n, ctx);
    if (!l.ok()) {
      failed.push_back(cat(n->opName(), ": ", l.error()));
      continue;
    }
    for (const cuda::KernelSpec& k : l->kernels) {
      ++kernels;
      if (!sources.insert(k.source).second) continue;
      auto cubin = nvrtc.compile(k.source, k.entry);
      if (!cubin.ok()) failed.push_back(cat(n->opName(), " [", k.entry, "]: ", cubin.error()));
    }
  }
  for (const std::string& f : failed) UNSCOPED_INFO(f);
  CHECK(failed.empty());
  CHECK(f16Nodes > 20);
  WARN("fp16 step: " << g->numNodes() << " nodes, " << kernels << " kernels, " << sources.size() << " distinct sources compiled");
}
#endif

}  // namespace tpc
