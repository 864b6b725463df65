// The GPT-2 builder: parameter names, shapes and count as in Hugging Face GPT-2, structure, and errors.
#include <catch2/catch.hpp>

#include <cmath>
#include <map>
#include <set>

#include "ir/verifier.h"
#include "models/gpt.h"

namespace tpc {
namespace {

ModelFile build(const GptConfig& g, const TrainConfig& c) {
  auto m = buildGpt(g, c);
  INFO((m.ok() ? std::string() : m.error()));
  REQUIRE(m.ok());
  return std::move(*m);
}

ModelPreset preset(const std::string& name) {
  auto p = gptPreset(name);
  REQUIRE(p.ok());
  return *p;
}

std::map<std::string, int64_t> opCounts(const Graph& g) {
  std::map<std::string, int64_t> n;
  for (const Node* node : g.nodes()) ++n[std::string(node->opName())];
  return n;
}

}  // namespace

TEST_CASE("gpt: the gpt2 preset has GPT-2's 124,439,808 parameters", "[gpt]") {
  ModelPreset p = preset("gpt2");
  ModelFile m = build(p.gpt, p.config);
  REQUIRE(m.gpt->vocab == 50257);
  REQUIRE(m.gpt->paddedVocab == 50304);  // wte has 47 padded rows
  int64_t total = 0;
  for (const Value* v : m.forward->params()) total += v->type().numel();
  // With the padded wte rows: 124,475,904; without them (as Hugging Face counts): 124,439,808.
  CHECK(total == 124475904);
  CHECK(total - (m.gpt->paddedVocab - m.gpt->vocab) * m.gpt->hidden == 124439808);
  CHECK(verifyGraph(*m.forward).ok());
}

TEST_CASE("gpt: parameter names, shapes and inits follow Hugging Face GPT-2", "[gpt]") {
  ModelPreset p = preset("gpt2");
  ModelFile m = build(p.gpt, p.config);
  const int64_t D = 768, L = 12;
  std::vector<std::pair<std::string, Shape>> want = {{"wte", {50304, D}}, {"wpe", {1024, D}}};
  for (int64_t i = 0; i < L; ++i) {
    std::string h = "h." + std::to_string(i) + ".";
    for (auto [n, s] : std::vector<std::pair<std::string, Shape>>{
             {"ln_1.weight", {D}}, {"ln_1.bias", {D}}, {"attn.c_attn.weight", {D, 3 * D}}, {"attn.c_attn.bias", {3 * D}},
             {"attn.c_proj.weight", {D, D}}, {"attn.c_proj.bias", {D}}, {"ln_2.weight", {D}}, {"ln_2.bias", {D}},
             {"mlp.c_fc.weight", {D, 4 * D}}, {"mlp.c_fc.bias", {4 * D}}, {"mlp.c_proj.weight", {4 * D, D}},
             {"mlp.c_proj.bias", {D}}})
      want.emplace_back(h + n, s);
  }
  want.emplace_back("ln_f.weight", Shape{D});
  want.emplace_back("ln_f.bias", Shape{D});
  const auto& params = m.forward->params();
  REQUIRE(params.size() == want.size());
  const double resid = 0.02 / std::sqrt(2.0 * L);
  for (size_t k = 0; k < want.size(); ++k) {
    INFO(want[k].first);
    CHECK(params[k]->name() == want[k].first);
    CHECK(params[k]->shape() == want[k].second);
    CHECK(params[k]->dtype() == DType::f32);
    const std::string& n = want[k].first;
    const InitSpec& init = params[k]->init();
    auto endsWith = [&](const std::string& s) { return n.size() >= s.size() && n.compare(n.size() - s.size(), s.size(), s) == 0; };
    if (n.find("ln_") != std::string::npos) CHECK(init.kind == (endsWith(".weight") ? "ones" : "zeros"));
    else if (endsWith(".bias")) CHECK(init.kind == "zeros");
    else if (endsWith("c_proj.weight")) CHECK(init == InitSpec{"normal", {resid}});
    else CHECK(init == InitSpec{"normal", {0.02}});
  }
}

TEST_CASE("gpt: graph structure", "[gpt]") {
  ModelPreset p = preset("tiny");
  SECTION("tiny: padded vocab is sliced off before the loss, wpe sliced only when seq < positions") {
    ModelFile m = build(p.gpt, p.config);
    auto n = opCounts(*m.forward);
    CHECK(n["attention"] == 2);
    CHECK(n["layer_norm"] == 5);
    CHECK(n["gelu"] == 2);
    CHECK(n["matmul"] == 2 * 4 + 1);
    CHECK(n["dropout"] == 0);
    CHECK(n["slice"] == 2 * 3 + 1);  // q/k/v per layer + logits (seq 64 == positions 64: wpe unsliced)
    const Graph& g = *m.forward;
    REQUIRE(g.outputs().size() == 1);
    CHECK(g.outputName(0) == "loss");
    CHECK(g.outputs()[0].value->type() == TensorType(DType::f32, {}));
    CHECK(m.lossOutput == "loss");
    CHECK(g.inputs()[0]->type() == TensorType(DType::i32, {8, 64}));
    CHECK(verifyGraph(g).ok());
    for (const Node* node : g.nodes())
      if (node->op() == OpKind::CrossEntropy) CHECK(node->operand(0)->shape() == Shape{8, 64, 257});
  }
  SECTION("no padding, shorter sequence, dropout with unique keys") {
    p.gpt.vocab = 256;
    p.gpt.paddedVocab = 0;
    p.config.seqLength = 32;
    p.config.microBatch = p.config.globalBatch = 2;
    p.gpt.hiddenDropout = 0.1;
    p.gpt.attentionDropout = 0.2;
    ModelFile m = build(p.gpt, p.config);
    CHECK(m.gpt->paddedVocab == 256);
    auto n = opCounts(*m.forward);
    CHECK(n["slice"] == 2 * 3 + 1);  // q/k/v + wpe[:32]; no logits slice
    CHECK(n["dropout"] == 1 + 2 * 2);
    std::set<int64_t> keys;
    int randomOps = 0;
    for (const Node* node : m.forward->nodes()) {
      if (node->op() == OpKind::Dropout) CHECK(node->getFloat("p") == 0.1);
      if (node->op() == OpKind::Attention) CHECK(node->getFloat("dropout") == 0.2);
      if (node->has(traits::Random)) {
        ++randomOps;
        keys.insert(node->getInt("key"));
      }
    }
    CHECK(randomOps == 1 + 2 * 3);
    CHECK(static_cast<int>(keys.size()) == randomOps);
    CHECK(verifyGraph(*m.forward).ok());
  }
}

TEST_CASE("gpt: every preset builds", "[gpt]") {
  for (const std::string& name : gptPresetNames()) {
    INFO(name);
    ModelPreset p = preset(name);
    ModelFile m = build(p.gpt, p.config);
    CHECK(verifyGraph(*m.forward).ok());
  }
  CHECK(gptPresetNames() == std::vector<std::string>{"tiny", "gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl", "gpt-6.7b"});
}

TEST_CASE("gpt: bad hyperparameters name the field", "[gpt]") {
  ModelPreset p = preset("tiny");
  auto err = [&](GptConfig g, TrainConfig c) {
    auto m = buildGpt(g, c);
    REQUIRE_FALSE(m.ok());
    CHECK(m.error().find('\n') == std::string::npos);
    return m.error();
  };
  GptConfig g = p.gpt;
  TrainConfig c = p.config;
  g.heads = 5;
  CHECK(err(g, c) == "arch.heads=5 must divide arch.hidden=128");
  g = p.gpt;
  c.seqLength = 128;
  CHECK(err(g, c) == "config.seq_length=128 is longer than the position table arch.positions=64");
  c = p.config;
  for (int64_t bad : {0, -3}) {
    g = p.gpt;
    g.layers = bad;
    CHECK(err(g, c) == "arch.layers must be > 0, got " + std::to_string(bad));
    g = p.gpt;
    g.hidden = bad;
    CHECK(err(g, c) == "arch.hidden must be > 0, got " + std::to_string(bad));
    g = p.gpt;
    c.microBatch = bad;
    CHECK(err(g, c) == "config.micro_batch_size must be > 0, got " + std::to_string(bad));
    c = p.config;
  }
  g = p.gpt;
  g.paddedVocab = 200;
  CHECK(err(g, c) == "arch.padded_vocab=200 must be >= arch.vocab=257");
  g = p.gpt;
  g.hiddenDropout = 1.0;
  CHECK(err(g, c) == "arch.hidden_dropout must be in [0, 1), got 1.0");
  g = p.gpt;
  c.globalBatch = 12;
  CHECK(err(g, c).find("config.global_batch_size=12 must be a multiple of") == 0);
}

}  // namespace tpc
