// GPT-2: learned position embeddings, pre-LayerNorm blocks with fused QKV and causal attention, a 4x
// GELU(tanh) MLP, final LayerNorm, LM head tied to the token embedding, mean cross-entropy loss.
#include "models/gpt.h"

#include <cmath>

#include "frontend/graph_builder.h"
#include "models/gpt_presets.inc"

namespace tpc {
namespace {

InitSpec normal(double std) { return InitSpec{"normal", {std}}; }
InitSpec zeros() { return InitSpec{"zeros", {}}; }
InitSpec ones() { return InitSpec{"ones", {}}; }

struct Block {
  GraphBuilder& b;
  const GptConfig& c;
  int64_t B, T;

  Value* layerNorm(const char* name, Value* x) {
    auto s = b.scope(name);
    Value* g = b.param("weight", {c.hidden}, ones());
    Value* beta = b.param("bias", {c.hidden}, zeros());
    return b.layerNorm(x, g, beta, c.layerNormEps);
  }
  // HF Conv1D: weight [in, out], bias [out].
  Value* conv1d(const char* name, Value* x, int64_t in, int64_t out, double std) {
    auto s = b.scope(name);
    Value* w = b.param("weight", {in, out}, normal(std));
    Value* bias = b.param("bias", {out}, zeros());
    return b.linear(x, w, bias);
  }

  Value* attention(Value* x, double residStd) {
    auto s = b.scope("attn");
    const int64_t D = c.hidden, H = c.heads, Dh = D / H;
    Value* qkv = conv1d("c_attn", x, D, 3 * D, c.initStd);  // [B, T, 3D]: q, k, v each [B, T, H*Dh]
    Value* heads = b.transpose(b.reshape(qkv, {B, T, 3, H, Dh}), {2, 0, 3, 1, 4});  // [3, B, H, T, Dh]
    Value* qkvSplit[3];
    for (int64_t i = 0; i < 3; ++i) qkvSplit[i] = b.reshape(b.slice(heads, 0, i, i + 1), {B, H, T, Dh});
    Value* att = b.attention(qkvSplit[0], qkvSplit[1], qkvSplit[2], c.attentionDropout);
    Value* merged = b.reshape(b.transpose(att, {0, 2, 1, 3}), {B, T, D});
    return b.dropout(conv1d("c_proj", merged, D, D, residStd), c.hiddenDropout);
  }

  Value* mlp(Value* x, double residStd) {
    auto s = b.scope("mlp");
    Value* h = b.gelu(conv1d("c_fc", x, c.hidden, 4 * c.hidden, c.initStd));
    return b.dropout(conv1d("c_proj", h, 4 * c.hidden, c.hidden, residStd), c.hiddenDropout);
  }
};

}  // namespace

Result<ModelFile> buildGpt(const GptConfig& gptIn, const TrainConfig& config) {
  TPC_TRY(validateTrainConfig(config));
  TPC_TRY(validateGpt(gptIn, config));
  GptConfig c = gptIn;
  c.paddedVocab = c.resolvedPaddedVocab();
  const int64_t B = config.microBatch, T = config.seqLength, D = c.hidden;

  ModelFile m;
  m.forward = std::make_unique<Graph>("gpt");
  GraphBuilder b(*m.forward);
  Value* tokens = b.input("tokens", DType::i32, {B, T});
  Value* targets = b.input("targets", DType::i32, {B, T});

  Value* wte = b.param("wte", {c.paddedVocab, D}, normal(c.initStd));
  Value* wpe = b.param("wpe", {c.positions, D}, normal(c.initStd));
  Value* pos = T < c.positions ? b.slice(wpe, 0, 0, T) : wpe;
  Value* x = b.dropout(b.add(b.embedding(wte, tokens), pos), c.hiddenDropout);

  // GPT-2 scales the residual projections' init by 1/sqrt(2 * layers) (two residual adds per block).
  const double residStd = c.initStd / std::sqrt(2.0 * double(c.layers));
  Block block{b, c, B, T};
  for (int64_t i = 0; i < c.layers; ++i) {
    auto s = b.scope("h." + std::to_string(i));
    x = b.add(x, block.attention(block.layerNorm("ln_1", x), residStd));
    x = b.add(x, block.mlp(block.layerNorm("ln_2", x), residStd));
  }
  Value* hf = block.layerNorm("ln_f", x);
  Value* logits = b.matmul(hf, wte, /*transB=*/true);  // [B, T, padded vocab]
  // Padded classes must not enter the softmax normalizer: keep the real vocab only.
  if (c.paddedVocab != c.vocab) logits = b.slice(logits, 2, 0, c.vocab);
  b.named(logits, "logits");
  Value* loss = b.named(b.reduceMean(b.crossEntropy(logits, targets), {0, 1}), "loss");
  b.output(loss, "loss");

  m.lossOutput = "loss";
  m.config = config;
  m.gpt = c;
  return m;
}

Shape gptStoredShape(const GptConfig& gpt, const std::string& name, Shape shape) {
  if (name == "wte" && !shape.empty()) shape[0] = gpt.vocab;
  return shape;
}

std::vector<std::string> gptPresetNames() {
  std::vector<std::string> names;
  for (const auto& [name, text] : kEmbedded) names.emplace_back(name);
  return names;
}

Result<ModelPreset> gptPreset(const std::string& name) {
  for (const auto& [n, text] : kEmbedded)
    if (n == name) return parsePresetJson(text, "models/presets/" + name + ".json");
  std::string known;
  for (const std::string& n : gptPresetNames()) known += (known.empty() ? "" : ", ") + n;
  return makeError("unknown preset '", name, "' (known: ", known, ")");
}

}  // namespace tpc
