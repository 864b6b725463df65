// Architecture records a model file may carry next to its graph, so that a run can rebuild the graph
// for another micro batch or sequence length (models/ has the builders). GPT-2 first.
#pragma once

#include <cstdint>

#include "frontend/train_config.h"
#include "ir/status.h"

namespace tpc {

// GPT-2's hyperparameters (Hugging Face names in comments). Batch and sequence length come from TrainConfig.
struct GptConfig {
  int64_t layers = 12;        // n_layer
  int64_t hidden = 768;       // n_embd
  int64_t heads = 12;         // n_head
  int64_t vocab = 50257;      // vocab_size
  int64_t paddedVocab = 0;    // rows of wte; 0: vocab rounded up to a multiple of 128
  int64_t positions = 1024;   // n_positions: rows of wpe, the longest sequence
  double hiddenDropout = 0.0;     // embd_pdrop and resid_pdrop
  double attentionDropout = 0.0;  // attn_pdrop
  double layerNormEps = 1e-5;     // layer_norm_epsilon
  double initStd = 0.02;          // initializer_range

  int64_t resolvedPaddedVocab() const { return paddedVocab > 0 ? paddedVocab : (vocab + 127) / 128 * 128; }
  bool operator==(const GptConfig&) const = default;
};

// The largest sizes validateGpt accepts: far above any real model, and they keep every tensor size far from
// int64 overflow.
inline constexpr int64_t kMaxGptLayers = 4096, kMaxGptHidden = 1 << 20, kMaxGptHeads = 1 << 16,
                         kMaxGptVocab = int64_t(1) << 30, kMaxGptPositions = 1 << 24;

// Checks the hyperparameters against each other and against the batch shape; errors name each field through
// `name`, by default the model file's ("arch.heads=5 must divide arch.hidden=128"; a CLI: the flag given).
Status validateGpt(const GptConfig& gpt, const TrainConfig& config, const ConfigFieldName& name = modelFileFieldName);

}  // namespace tpc
