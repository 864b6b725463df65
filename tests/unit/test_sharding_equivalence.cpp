// The sharding equivalence tests (issue 5): a 2-layer GPT trained 3 steps under tp in {1,2,4,8} x sp on/off
// x dp in {1,2} x dropout off/on, in fp64 and fp32, gives the single-rank loss at every step and the single-rank
// updated parameters (gathered from the shards through readState). Each rank runs its partitioned program
// on the CPU mesh backend (a thread per rank).
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <random>

#include "gpt_step_support.h"
#include "passes/pass_registry.h"
#include "passes/sharding/sharding.h"
#include "worst_error.h"

namespace tpc {
namespace {

struct Setup {
  int64_t tp = 1, dp = 1;
  bool sp = false, dropout = false, zero1 = false;
  std::string policy = "megatron-tp";
  int64_t accum = 1;  // micro-batches a step: each of 4 / accum sequences (the step's 4 sequences are the same)
};

GptConfig smallGpt(bool dropout) {
  GptConfig g = test::smallGpt();
  g.heads = 8;
  g.paddedVocab = 1024;  // a multiple of 128 x 8: every tp of the test splits it
  g.hiddenDropout = dropout ? 0.1 : 0.0;
  g.attentionDropout = dropout ? 0.1 : 0.0;
  return g;
}

struct Trace {
  std::vector<double> losses, norms;
  std::map<std::string, std::vector<double>> params;
};

std::vector<double> asDoubles(const HostTensor& t) {
  HostTensor d = t.convertTo(DType::f64);
  return std::vector<double>(d.data<double>(), d.data<double>() + d.numel());
}

std::vector<TensorMap> batches(int64_t steps) {
  std::mt19937 rng(7);
  std::vector<TensorMap> out;
  for (int64_t s = 0; s < steps; ++s) out.push_back(test::gptBatch(rng, {4, 16}, 100, 1e-3f, s + 1));
  return out;
}

// Trains `g` (the global graph; annotated when it has a mesh) for `steps`: on one rank through the CPU
// backend, or partitioned per rank through the CPU mesh backend. Params come back unsharded via readState.
Trace train(const Graph& g, int64_t steps, uint64_t seed, bool fp64 = false, float lr = 1e-3f) {
  CpuOptions o;
  o.fp64 = fp64;
  o.threads = 2;
  o.seed = seed;
  auto backend = test::preparedCpuBackend(g, o, 1);
  Trace trace;
  auto data = batches(steps);
  for (auto& b : data) {
    b["lr"] = HostTensor::scalarF32(lr);
    // An accumulated step reads its [4, 16] batch as [accum, 4 / accum, 16]: micro-batch i is sequences 4i/accum...
    for (const Value* in : g.inputs())
      if (b.count(in->name()) && b.at(in->name()).shape() != in->shape()) {
        HostTensor t(in->type());
        REQUIRE(t.bytes() == b.at(in->name()).bytes());
        std::memcpy(t.raw(), b.at(in->name()).raw(), t.bytes());
        b[in->name()] = t;
      }
  }
  for (int64_t s = 0; s < steps; ++s) {
    auto out = backend->step(data[s], s);
    INFO("step " << s << ": " << (out.ok() ? std::string() : out.error()));
    REQUIRE(out.ok());
    trace.losses.push_back(asDoubles(out->at("loss"))[0]);
    trace.norms.push_back(asDoubles(out->at("grad_norm"))[0]);
  }
  for (const Value* p : g.params()) {
    auto t = backend->readState(p->name());
    INFO(p->name() << ": " << (t.ok() ? std::string() : t.error()));
    REQUIRE(t.ok());
    trace.params[p->name()] = asDoubles(*t);
  }
  return trace;
}

std::unique_ptr<Graph> stepGraph(const Setup& s) {
  std::string passes;
  if (s.tp > 1 || s.sp) passes += s.policy + "(tp=" + std::to_string(s.tp) + "),";
  if (s.sp) passes += "sequence-parallel,";
  passes += s.accum == 1 ? test::kTrainPasses : "autodiff(accum=" + std::to_string(s.accum) + ", clip-grad=1.0, weight-decay=0.1),cse,dce";
  if (s.dp > 1) passes += ",data-parallel(dp=" + std::to_string(s.dp) + (s.zero1 ? ", zero1=true" : "") + ")";
  return test::gptStep(smallGpt(s.dropout), 4 / s.accum, passes, s.accum);
}

// Per tensor: max |a - b| / max |b| (max-norm relative) and ||a - b||_2 / ||b||_2 (norm-wise relative); a NaN
// makes both infinite (so the worst tensor below).
struct TensorErr {
  double maxRel = 0, l2Rel = 0;
};
TensorErr tensorErr(const std::vector<double>& a, const std::vector<double>& b) {
  double num = 0, den = 0, num2 = 0, den2 = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    double d = a[i] - b[i];
    num = test::worseOf(num, test::absError(a[i], b[i]));
    den = std::max(den, std::abs(b[i]));
    num2 += d * d;
    den2 += b[i] * b[i];
  }
  return {num / std::max(den, 1e-300), test::nanAsInfinite(std::sqrt(num2) / std::max(std::sqrt(den2), 1e-300))};
}

struct Worst {
  double loss = 0, maxRel = 0, l2Rel = 0;
  double model = 0, moments = 0;  // norm-wise over all parameters as one vector; over all AdamW moments
  std::string maxName, l2Name;
};

// Trains one rank and the sharded setup 3 steps each, in fp32 or fp64, and returns the worst errors.
Worst compare(const Setup& s, bool fp64) {
  const int64_t steps = 3;
  Trace ref = train(*stepGraph(Setup{1, 1, false, s.dropout}), steps, 99, fp64);
  Trace got = train(*stepGraph(s), steps, 99, fp64);
  REQUIRE(got.losses.size() == ref.losses.size());
  Worst w;
  w.loss = std::max(test::worstRelError(got.losses, ref.losses), test::worstRelError(got.norms, ref.norms));
  double diff2[2] = {0, 0}, norm2[2] = {0, 0};
  for (const auto& [name, v] : ref.params) {
    REQUIRE(got.params.count(name));
    std::vector<double> a = got.params.at(name), b = v;
    REQUIRE(a.size() == b.size());
    int moment = name.find(".adam_") != std::string::npos ? 1 : 0;
    for (size_t i = 0; i < a.size(); ++i) {
      diff2[moment] += (a[i] - b[i]) * (a[i] - b[i]);
      norm2[moment] += b[i] * b[i];
    }
    TensorErr e = tensorErr(a, b);
    if (e.maxRel > w.maxRel) w.maxRel = e.maxRel, w.maxName = name;
    if (e.l2Rel > w.l2Rel) w.l2Rel = e.l2Rel, w.l2Name = name;
  }
  w.model = std::sqrt(diff2[0] / norm2[0]);
  w.moments = std::sqrt(diff2[1] / norm2[1]);
  return w;
}

// Measured (3 steps, lr 1e-3, AdamW eps 1e-8, every setup below):
// - fp64: every tensor (params and moments) within 4e-12 of one rank, element-wise (max-norm), nothing left
//   out. The partitioned step computes the same function; a real error shows up here (the weight decay that
//   megatron-tp's [3, D] view of c_attn.bias used to get was 1e-4).
// - fp32: loss and grad norm within 3e-7. All parameters taken as one vector within 1.2e-6 norm-wise
//   (||a-b|| / ||b||), the AdamW moments within 4e-6: that is how "the updated parameters within 1e-5
//   relative" is read in fp32. Element-wise they are NOT within 1e-5: a handful of elements per run differ
//   by up to 1% of an lr step (up to 1.2e-3 of a tensor's max). Those are elements whose gradient is as
//   small as AdamW's eps (e.g. h.0.mlp.c_fc.weight[5, 253], |g| ~ 1.8e-8 at step 1), where the update
//   g / (|g| + eps) is linear in g, and g, a sum whose terms cancel, carries the ~1e-7 relative rounding
//   difference of the activations (row-parallel partial sums are rounded to fp32 before the all_reduce)
//   as a few percent; and the key third of c_attn.bias, whose gradient is identically zero (softmax is
//   invariant to a per-query constant), so both runs feed AdamW rounding noise (|g| ~ 1e-12) that it turns
//   into steps of ~1e-3 lr of arbitrary sign. No reduction order removes that in fp32; fp64 shows the
//   difference is rounding and nothing else.
void checkEquivalent(const Setup& s) {
  Worst f64 = compare(s, true);
  Worst f32 = compare(s, false);
  WARN("tp=" << s.tp << " dp=" << s.dp << " accum=" << s.accum << " sp=" << s.sp << " dropout=" << s.dropout << " zero1=" << s.zero1 << ": fp64 loss/grad-norm "
             << f64.loss << ", worst tensor max-norm " << f64.maxRel << " (" << f64.maxName << "); fp32 loss/grad-norm "
             << f32.loss << ", params " << f32.model << " and moments " << f32.moments << " norm-wise; worst tensor "
             << f32.l2Rel << " norm-wise (" << f32.l2Name << "), " << f32.maxRel << " max-norm (" << f32.maxName << ")");
  CHECK(f64.loss <= 1e-5);
  CHECK(f64.maxRel <= 1e-5);
  CHECK(f64.maxRel <= 1e-9);  // the measured 4e-12 with margin: catches real errors far below 1e-5
  CHECK(f32.loss <= 1e-5);
  CHECK(f32.model <= 1e-5);
  CHECK(f32.moments <= 1e-5);
}

}  // namespace

// (tp 1 without sp or dp is the reference itself: nothing to compare.)
TEST_CASE("sharding equivalence: tp 2, 4, 8 match one rank", "[sharding][equivalence]") {
  for (bool dropout : {false, true})
    for (int64_t tp : {2, 4, 8}) checkEquivalent(Setup{tp, 1, false, dropout});
}

TEST_CASE("sharding equivalence: sequence parallel tp 1, 2, 4, 8 match one rank", "[sharding][equivalence]") {
  for (bool dropout : {false, true})
    for (int64_t tp : {1, 2, 4, 8}) checkEquivalent(Setup{tp, 1, true, dropout});
}

TEST_CASE("sharding equivalence: dp 2 x tp 1, 2, 4, 8, sp off and on, match one rank", "[sharding][equivalence]") {
  for (bool dropout : {false, true})
    for (bool sp : {false, true})
      for (int64_t tp : {1, 2, 4, 8}) checkEquivalent(Setup{tp, 2, sp, dropout});
}

// Gradient accumulation is one more split of the batch: micro-batch i draws block i of the step's dropout masks, so
// micro 2 x accumulation 2 (or micro 1 x accumulation 2 x dp 2) trains as micro 4 does. (The audit of the thirty-ninth
// session: every micro-batch drew the same masks, so accumulation did not average the dropout noise.)
TEST_CASE("sharding equivalence: gradient accumulation x dp, tp and sp matches one micro-batch of the whole batch",
          "[sharding][equivalence]") {
  for (bool dropout : {false, true}) {
    checkEquivalent(Setup{1, 1, false, dropout, false, "megatron-tp", 2});
    checkEquivalent(Setup{1, 1, false, dropout, false, "megatron-tp", 4});
    checkEquivalent(Setup{1, 2, false, dropout, false, "megatron-tp", 2});
    checkEquivalent(Setup{2, 2, true, dropout, false, "megatron-tp", 2});
    checkEquivalent(Setup{4, 1, false, dropout, false, "megatron-tp", 2});
  }
}

// A policy that places the MLPs' weights alone (fc1 and its bias by column, fc2 by row, as the plugin of a user's
// might) and leaves the rest to the engine. fc2's output is partial where its bias is added: the bias must stay
// whole on every rank and be added on one (the zero share), not adopt the partial placement (summed over the ranks
// each step, which the backends then refused as a partial parameter).
class MlpRowsOnly final : public Pass {
 public:
  explicit MlpRowsOnly(int64_t tp) : tp_(tp) {}
  std::string_view name() const override { return "test-mlp-rows-only"; }
  Result<bool> run(Graph& g) override {
    TPC_TRY(ensureMeshAxis(g, "tp", tp_, "test-mlp-rows-only"));
    auto endsWith = [](const std::string& n, const std::string& tail) {
      return n.size() >= tail.size() && n.compare(n.size() - tail.size(), tail.size(), tail) == 0;
    };
    for (Value* p : g.params()) {
      if (endsWith(p->name(), ".mlp.c_fc.weight")) TPC_TRY(annotatePlacement(p, "tp", AxisPlacement::split(1), "test"));
      if (endsWith(p->name(), ".mlp.c_fc.bias")) TPC_TRY(annotatePlacement(p, "tp", AxisPlacement::split(0), "test"));
      if (endsWith(p->name(), ".mlp.c_proj.weight")) TPC_TRY(annotatePlacement(p, "tp", AxisPlacement::split(0), "test"));
    }
    return true;
  }

 private:
  int64_t tp_;
};

TEST_CASE("sharding equivalence: a policy that leaves the row-parallel bias unplaced matches one rank",
          "[sharding][equivalence]") {
  if (!PassRegistry::global().find("test-mlp-rows-only"))
    REQUIRE(PassRegistry::global()
                .add({"test-mlp-rows-only", "the MLPs' weights alone (a test)", {{"tp", "tensor-parallel size"}},
                      [](const PassOptions& o) -> Result<std::unique_ptr<Pass>> {
                        TPC_ASSIGN(int64_t tp, o.getInt("tp", 0));
                        return std::unique_ptr<Pass>(new MlpRowsOnly(tp));
                      }})
                .ok());
  // (Before the fix, the CPU mesh backend refused the step: "parameter %h.0.mlp.c_proj.bias: placement [tp:P] is
  // partial".)
  for (int64_t tp : {2, 4}) checkEquivalent(Setup{tp, 1, false, false, false, "test-mlp-rows-only"});
}

TEST_CASE("sharding equivalence: ZeRO-1 (dp 2, zero1) x tp 1, 2, 4, sp off and on, matches one rank",
          "[sharding][equivalence][zero1]") {
  for (bool dropout : {false, true})
    for (bool sp : {false, true})
      for (int64_t tp : {1, 2, 4}) checkEquivalent(Setup{tp, 2, sp, dropout, true});
}

}  // namespace tpc
