// The GPT-2 architecture as a forward graph, with Hugging Face GPT-2 parameter names and layouts so that
// HF weights map one to one (wte, wpe, h.{i}.attn.c_attn.weight [hidden, 3*hidden], ..., ln_f.*).
#pragma once

#include <string>
#include <vector>

#include "frontend/architecture.h"
#include "frontend/model_file.h"

namespace tpc {

// Builds the forward graph for micro batch config.microBatch and sequence length config.seqLength:
// inputs %tokens i32[B,T], %targets i32[B,T]; output "loss" (mean cross entropy over the real vocab).
// Errors (bad hyperparameters) name the field.
Result<ModelFile> buildGpt(const GptConfig& gpt, const TrainConfig& config);

// The layout GPT parameter `name` (graph shape `shape`) is stored in, in checkpoints and Hugging Face files:
// its own, except the embedding wte, stored with the real vocabulary's rows only (its padding rows depend on
// the run, e.g. --tp), as Hugging Face does.
Shape gptStoredShape(const GptConfig& gpt, const std::string& name, Shape shape);

// The presets shipped in models/presets/*.json (embedded at build time), by name.
std::vector<std::string> gptPresetNames();
Result<ModelPreset> gptPreset(const std::string& name);

}  // namespace tpc
