// For tests that build and train a small GPT (CPU, CUDA lowering, GPU): its training step through any pass
// pipeline, the ranks of a sharded step, a CPU backend prepared with initialised state, random batches and a
// training loop that returns the losses.
#pragma once

#include <catch2/catch.hpp>

#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "models/gpt.h"
#include "passes/builtin_passes.h"
#include "passes/pipeline.h"
#include "passes/sharding/sharding.h"
#include "runtime/backend.h"
#include "runtime/cpu/cpu_backend.h"
#include "runtime/cpu/cpu_mesh_backend.h"
#include "runtime/param_init.h"
#include "runtime/trainer.h"

namespace tpc::test {

// The passes of most test steps: autodiff with clipping, weight decay and AdamW, then cleanup.
inline const std::string kTrainPasses = "autodiff(clip-grad=1.0, weight-decay=0.1),cse,dce";

// "megatron-tp(tp=N)," to put before a pipeline when tp > 1; "" otherwise.
inline std::string megatronTp(int64_t tp) { return tp > 1 ? "megatron-tp(tp=" + std::to_string(tp) + ")," : ""; }

// 2 layers, hidden 64, 4 heads, vocabulary 100 padded to 256, 16 positions, no dropout.
inline GptConfig smallGpt() {
  GptConfig g;
  g.layers = 2;
  g.hidden = 64;
  g.heads = 4;
  g.vocab = 100;
  g.paddedVocab = 256;
  g.positions = 16;
  return g;
}

// buildGpt for a micro batch of `microBatch` sequences of gpt.positions tokens (`accum` of them accumulated).
inline ModelFile gptModel(const GptConfig& gpt, int64_t microBatch, int64_t accum = 1) {
  TrainConfig c;
  c.microBatch = microBatch;
  c.globalBatch = microBatch * accum;
  c.seqLength = gpt.positions;
  auto m = buildGpt(gpt, c);
  REQUIRE(m.ok());
  return std::move(m).value();
}

// Runs the pass pipeline `passes` on `g`; propagates placements when they gave it a mesh.
inline void runPasses(Graph& g, const std::string& passes) {
  PassManager pm;
  Status s = pm.addPipeline(passes, "");
  INFO(passes << ": " << (s.ok() ? std::string() : s.error()));
  REQUIRE(s.ok());
  s = pm.run(g);
  INFO((s.ok() ? std::string() : s.error()));
  REQUIRE(s.ok());
  if (!g.mesh().empty()) REQUIRE(propagatePlacements(g).ok());
}

// The training step of gptModel(gpt, microBatch, accum): its forward graph run through `passes`.
inline std::unique_ptr<Graph> gptStep(const GptConfig& gpt, int64_t microBatch, const std::string& passes,
                                      int64_t accum = 1) {
  std::unique_ptr<Graph> step = std::move(gptModel(gpt, microBatch, accum).forward);
  runPasses(*step, passes);
  return step;
}

// Every rank's graph of a sharded step; none for an unsharded one.
inline std::vector<std::unique_ptr<Graph>> rankGraphs(const Graph& step) {
  std::vector<std::unique_ptr<Graph>> ranks;
  for (int64_t r = 0; !step.mesh().empty() && r < step.mesh().numRanks(); ++r) {
    auto l = partitionForRank(step, r);
    INFO("rank " << r << ": " << (l.ok() ? std::string() : l.error()));
    REQUIRE(l.ok());
    ranks.push_back(std::move(*l));
  }
  return ranks;
}

// A short run's trainer settings: `iters` steps, lr `maxLr` decaying (cosine) to a tenth of it over the run, no
// warmup, no log lines.
inline TrainerSettings shortRun(int64_t iters, double maxLr) {
  TrainerSettings t;
  t.trainIters = iters;
  t.logInterval = 0;
  t.lr.maxLr = maxLr;
  t.lr.minLr = maxLr / 10;
  t.lr.warmupIters = 0;
  t.lr.decayIters = iters;
  return t;
}

// Every parameter (and optimizer state) of `step` from initParam(seed).
inline TensorMap initialState(const Graph& step, uint64_t seed) {
  TensorMap state;
  for (const Value* p : step.params()) state[p->name()] = initParam(*p, seed);
  return state;
}

// Prepares `b` for `step` with initialState(step, seed).
inline void prepareInitialState(Backend& b, const Graph& step, uint64_t seed) {
  Status st = b.prepare(step, initialState(step, seed));
  INFO((st.ok() ? std::string() : st.error()));
  REQUIRE(st.ok());
}

// The CPU backend for `step` (the mesh backend over its ranks when it is sharded), prepared with initParam(seed).
inline std::unique_ptr<Backend> preparedCpuBackend(const Graph& step, CpuOptions o, uint64_t seed) {
  std::unique_ptr<Backend> b = step.mesh().empty() ? createCpuBackend(o) : createCpuMeshBackend(rankGraphs(step), o);
  prepareInitialState(*b, step, seed);
  return b;
}

// A training batch: tokens and targets of `shape` drawn from `rng` modulo `vocab` (the tokens first); with
// `echo`, the targets are the tokens (learnable). lr and the step input beside them.
inline TensorMap gptBatch(std::mt19937& rng, const Shape& shape, int64_t vocab, float lr, int64_t step,
                          bool echo = false) {
  TensorMap m;
  for (const char* name : {"tokens", "targets"}) {
    HostTensor t(TensorType(DType::i32, shape));
    if (echo && m.count("tokens")) t = m.at("tokens").clone();
    else
      for (int64_t i = 0; i < t.numel(); ++i) t.data<int32_t>()[i] = static_cast<int32_t>(rng() % vocab);
    m[name] = t;
  }
  m["lr"] = HostTensor::scalarF32(lr);
  m["step"] = HostTensor::scalarF32(static_cast<float>(step));
  return m;
}

// What trainLosses feeds a step.
struct TrainBatches {
  Shape shape = {4, 16};
  int64_t vocab = 100;
  float lr = 1e-3f;
  bool echo = false;
  int64_t firstStepIndex = 1;  // Backend::step's index of the first step (its step input is always 1)
};

// `steps` steps on batches from `rng`; the losses.
inline std::vector<double> trainLosses(Backend& b, std::mt19937& rng, int64_t steps, const TrainBatches& batches = {}) {
  std::vector<double> losses;
  for (int64_t s = 0; s < steps; ++s) {
    auto out = b.step(gptBatch(rng, batches.shape, batches.vocab, batches.lr, s + 1, batches.echo),
                      s + batches.firstStepIndex);
    INFO("step " << s << ": " << (out.ok() ? std::string() : out.error()));
    REQUIRE(out.ok());
    losses.push_back(out->at("loss").data<float>()[0]);
  }
  return losses;
}

// `out` (a step's outputs) with every state tensor of `step` (parameters and moments) as `b` holds it added.
inline TensorMap withState(const Backend& b, const Graph& step, TensorMap out) {
  for (const Value* p : step.params()) {
    auto t = b.readState(p->name());
    REQUIRE(t.ok());
    out[p->name()] = *t;
  }
  return out;
}

// Every state tensor of `step` (parameters and optimizer moments) as `b` holds it, as bytes.
inline std::map<std::string, std::string> stateBytes(const Backend& b, const Graph& step) {
  std::map<std::string, std::string> s;
  for (const Value* p : step.params()) {
    auto t = b.readState(p->name());
    REQUIRE(t.ok());
    s[p->name()] = std::string(reinterpret_cast<const char*>(t->raw()), t->bytes());
  }
  return s;
}

// Windows for the trainer or an evaluator, the same each time one is constructed: tokens drawn modulo
// `vocab` from a generator seeded `seed`, targets (token * mul + add) % vocab: learnable (mul 1, add 0: the
// tokens themselves).
class LearnableBatches : public BatchSource {
 public:
  LearnableBatches(int64_t vocab, uint32_t seed, int64_t mul = 1, int64_t add = 0)
      : vocab_(vocab), mul_(mul), add_(add), rng_(seed) {}
  Status next(int32_t* tokens, int32_t* targets, int64_t rows, int64_t seq) override {
    for (int64_t i = 0; i < rows * seq; ++i) {
      tokens[i] = static_cast<int32_t>(rng_() % vocab_);
      targets[i] = static_cast<int32_t>((tokens[i] * mul_ + add_) % vocab_);
    }
    return {};
  }

 private:
  int64_t vocab_, mul_, add_;
  std::mt19937 rng_;
};

}  // namespace tpc::test
