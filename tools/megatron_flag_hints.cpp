// Megatron-LM's flag names that tpc spells differently, and "did you mean" for typos of tpc's own flags.
#include "tools/megatron_flag_hints.h"

#include <algorithm>

#include "ir/status.h"

namespace tpc::cli {

namespace {

enum class Kind {
  Flag,       // a flag of the sub-command (only suggested where it has it)
  ModelFile,  // a model-file field: `tpc new` has the flag, the other sub-commands read the file
  Note,       // no tpc flag: the note says why ("{value}" in it: the user's value, or `value`)
};

struct MegatronFlag {
  const char* name;  // Megatron-LM's, without dashes
  Kind kind;
  const char* flag;  // tpc's
  // The user's value carries over to tpc's flag (false for Megatron-LM's toggles, whose next word is not theirs,
  // and for a value that means something else in tpc); `value` is written otherwise.
  bool keepsValue;
  const char* value;
  const char* note;
};

const MegatronFlag kMegatronFlags[] = {
    {"tensor-model-parallel-size", Kind::Flag, "tp", true, "N", ""},
    {"data-parallel-size", Kind::Flag, "dp", true, "N", ""},
    {"sequence-parallel", Kind::Flag, "sp", false, "", ""},
    {"recompute-activations", Kind::Flag, "recompute", false, "selective", ""},
    {"recompute-granularity", Kind::Flag, "recompute", true, "selective|full", ""},
    {"seq-length", Kind::Flag, "seq", true, "N", ""},  // `tpc new` (tpc run has --seq-length)
    {"num-layers", Kind::ModelFile, "layers", true, "N", ""},
    {"hidden-size", Kind::ModelFile, "hidden", true, "N", ""},
    {"num-attention-heads", Kind::ModelFile, "heads", true, "N", ""},
    {"max-position-embeddings", Kind::ModelFile, "positions", true, "N", ""},
    {"vocab-size", Kind::ModelFile, "vocab", true, "N", ""},
    {"hidden-dropout", Kind::ModelFile, "hidden-dropout", true, "P", ""},
    {"attention-dropout", Kind::ModelFile, "attention-dropout", true, "P", ""},
    {"ffn-hidden-size", Kind::Note, "", true, "",
     "Megatron-LM's flag has no equivalent in tpc, whose GPT has an MLP of 4 x hidden (as GPT-2's)"},
    {"use-flash-attn", Kind::Note, "", false, "",
     "Megatron-LM's flag is not needed: tpc's attention is always one fused flash/cuDNN kernel; drop it"},
    // Megatron-LM's speed and implementation switches: tpc has one way, and says which.
    {"use-mcore-models", Kind::Note, "", false, "",
     "Megatron-LM's flag is not needed: tpc builds its GPT as a graph of its own (no legacy or Megatron-Core model to "
     "pick); drop it"},
    {"transformer-impl", Kind::Note, "", true, "",
     "Megatron-LM's flag is not needed: tpc compiles its own kernels (no Transformer Engine or local implementation to "
     "pick); drop it"},
    {"no-masked-softmax-fusion", Kind::Note, "", false, "",
     "Megatron-LM's flag is not needed: tpc's attention is always one fused flash/cuDNN kernel, mask and softmax "
     "inside it; drop it"},
    {"attention-softmax-in-fp32", Kind::Note, "", false, "",
     "Megatron-LM's flag is not needed: tpc's attention kernels compute the softmax in fp32 in every precision; drop it"},
    {"num-workers", Kind::Note, "", true, "",
     "Megatron-LM's flag is not needed: tpc reads the memory-mapped dataset in the training process, with no loader "
     "workers; drop it"},
    {"DDP-impl", Kind::Note, "", true, "",
     "Megatron-LM's flag is not needed: tpc's --dp reduces the gradients inside its training step (collectives in the "
     "graph), with no DDP wrapper to pick; drop it"},
    {"overlap-grad-reduce", Kind::Note, "", false, "",
     "Megatron-LM's flag is not needed: tpc overlaps its collectives with compute on a communication stream by default "
     "(--one-stream turns that off); drop it"},
    {"overlap-param-gather", Kind::Note, "", false, "",
     "Megatron-LM's flag is not needed: tpc overlaps its collectives with compute on a communication stream by default "
     "(--one-stream turns that off); drop it"},
    {"accumulate-allreduce-grads-in-fp32", Kind::Note, "", false, "",
     "Megatron-LM's flag is not needed: tpc's parameter gradients are always fp32 (the fp32 master weights'), "
     "accumulated and all-reduced in fp32; drop it"},
    {"ckpt-format", Kind::Note, "", true, "",
     "Megatron-LM's flag is not needed: tpc writes one checkpoint format (iter_N/model.safetensors and state.json, "
     "loadable under any --tp/--dp/--sp; `tpc export --hf` writes a Hugging Face GPT-2); drop it"},
    {"use-checkpoint-args", Kind::Note, "", false, "",
     "Megatron-LM's flag is not needed: tpc takes the model's sizes from the model file, and --load checks the "
     "checkpoint against them; drop it"},
    {"log-throughput", Kind::Note, "", false, "",
     "Megatron-LM's flag is not needed: tpc logs tokens/s (and MFU on a GPU) every --log-interval; drop it"},
    {"timing-log-level", Kind::Note, "", true, "",
     "Megatron-LM's flag is not needed: tpc prints its startup times, and --profile-step N times one step kernel by "
     "kernel; drop it"},
    {"log-num-zeros-in-grad", Kind::Note, "", false, "",
     "Megatron-LM's flag has no equivalent in tpc, which logs the gradient norm every --log-interval; drop it"},
    {"log-validation-ppl-to-tensorboard", Kind::Note, "", false, "",
     "Megatron-LM's flag is not needed: tpc logs the validation loss and perplexity at every evaluation (the console, "
     "--log-jsonl, --tensorboard-dir as 'lm loss validation ppl', --metrics-port); drop it"},
    {"init-method-std", Kind::Note, "", true, "X",
     "the model file holds Megatron-LM's --init-method-std as arch.init_std (GPT-2's 0.02 by default): write a .json "
     "one with `tpc new gpt --preset NAME -o MODEL.json`, set its arch.init_std to {value}, and run that"},
    // Megatron-LM's other architectures: tpc's GPT is GPT-2's.
    {"untie-embeddings-and-output-weights", Kind::Note, "", false, "",
     "Megatron-LM's flag has no equivalent in tpc, whose GPT is GPT-2's architecture: the output layer is the word "
     "embedding (tied); drop it"},
    {"swiglu", Kind::Note, "", false, "",
     "Megatron-LM's flag has no equivalent in tpc, whose GPT is GPT-2's architecture: a GELU MLP of 4 x hidden; drop it"},
    {"normalization", Kind::Note, "", true, "",
     "Megatron-LM's flag has no equivalent in tpc, whose GPT is GPT-2's architecture: LayerNorm; drop it"},
    {"position-embedding-type", Kind::Note, "", true, "",
     "Megatron-LM's flag has no equivalent in tpc, whose GPT is GPT-2's architecture: learned absolute position "
     "embeddings (Megatron-LM's learned_absolute); drop it"},
    {"no-position-embedding", Kind::Note, "", false, "",
     "Megatron-LM's flag has no equivalent in tpc, whose GPT is GPT-2's architecture: learned absolute position "
     "embeddings; drop it"},
    {"group-query-attention", Kind::Note, "", false, "",
     "Megatron-LM's flag has no equivalent in tpc, whose GPT is GPT-2's architecture: multi-head attention, a key and "
     "value head per query head; drop it"},
    {"num-query-groups", Kind::Note, "", true, "",
     "Megatron-LM's flag has no equivalent in tpc, whose GPT is GPT-2's architecture: multi-head attention, a key and "
     "value head per query head; drop it"},
    // Megatron-LM starts from a checkpoint's weights alone with these two (the step goes on) or with --finetune (the
    // step starts at 0): tpc has --finetune only, so these are not an alias of it.
    {"no-load-optim", Kind::Note, "", false, "",
     "to start from a checkpoint's parameters only, give --load DIR --finetune, as in Megatron-LM (the AdamW state, "
     "step and data order start anew; tpc does not go on from the checkpoint's step without its AdamW state); drop it"},
    {"no-load-rng", Kind::Note, "", false, "",
     "to start from a checkpoint's parameters only, give --load DIR --finetune, as in Megatron-LM (the AdamW state, "
     "step and data order start anew; tpc does not go on from the checkpoint's step without its AdamW state); drop it"},
    // tools/preprocess_data.py's, met by `tpc prepare` and `tpc tokenize`.
    {"json-keys", Kind::Flag, "json-key", true, "KEY",
     "; one key, whose documents go to PREFIX.bin/.idx (Megatron-LM names them PREFIX_KEY_document)"},
    {"tokenizer-type", Kind::Flag, "tokenizer", false, "gpt2", "; its GPT2BPETokenizer is tpc's gpt2, the other is byte"},
    {"vocab-file", Kind::Note, "", true, "",
     "Megatron-LM's flag is not needed: tpc reads the GPT-2 vocabulary and merges from $TPC_DATA_DIR/gpt2 (encoder.json, "
     "vocab.bpe; scripts/fetch_data.sh fetches them); drop it"},
    {"merge-file", Kind::Note, "", true, "",
     "Megatron-LM's flag is not needed: tpc reads the GPT-2 vocabulary and merges from $TPC_DATA_DIR/gpt2 (encoder.json, "
     "vocab.bpe; scripts/fetch_data.sh fetches them); drop it"},
    {"dataset-impl", Kind::Note, "", true, "",
     "Megatron-LM's flag is not needed: tpc writes and reads only the mmap indexed dataset (MMIDIDX); drop it"},
    {"split-sentences", Kind::Note, "", false, "",
     "Megatron-LM's flag has no equivalent in tpc: a document is one line of text or one JSONL record, never split"},
};

std::string dashed(const std::string& name) { return (name.size() == 1 ? "-" : "--") + name; }

// Optimal string alignment distance: edits plus swaps of two neighbouring letters ("--tarin-iters").
size_t editDistance(const std::string& a, const std::string& b) {
  std::vector<std::vector<size_t>> d(a.size() + 1, std::vector<size_t>(b.size() + 1));
  for (size_t i = 0; i <= a.size(); ++i) d[i][0] = i;
  for (size_t j = 0; j <= b.size(); ++j) d[0][j] = j;
  for (size_t i = 1; i <= a.size(); ++i)
    for (size_t j = 1; j <= b.size(); ++j) {
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + (a[i - 1] != b[j - 1])});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1]) d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
    }
  return d[a.size()][b.size()];
}

// The sub-command's flag a typo most likely meant: the closest by edit distance, or the one flag the name
// begins (Megatron-LM's argparse takes such abbreviations, tpc does not). "" when none is close.
std::string closestFlag(const std::string& name, const std::vector<std::string>& known) {
  if (name.size() < 2) return "";
  const size_t most = name.size() <= 4 ? 1 : std::min<size_t>(3, name.size() / 3);
  std::string best, prefixOf;
  size_t bestDistance = most + 1, prefixes = 0;
  for (const std::string& k : known) {
    if (size_t dist = editDistance(name, k); dist < bestDistance) {
      best = k;
      bestDistance = dist;
    }
    if (name.size() >= 3 && k.compare(0, name.size(), name) == 0) {
      prefixOf = k;
      ++prefixes;
    }
  }
  return !best.empty() ? best : prefixes == 1 ? prefixOf : "";
}

}  // namespace

std::string unknownOptionHint(const std::string& command, const std::string& name, const std::optional<std::string>& value,
                              const std::vector<std::string>& known) {
  // argparse users also write --tensor_model_parallel_size.
  std::string spelled = name;
  std::replace(spelled.begin(), spelled.end(), '_', '-');
  auto has = [&](const std::string& f) { return std::find(known.begin(), known.end(), f) != known.end(); };
  for (const MegatronFlag& m : kMegatronFlags) {
    if (spelled != m.name) continue;
    const std::string theirs = cat("Megatron-LM's --", m.name);
    const std::string v = m.keepsValue && value ? *value : m.value;
    if (m.kind == Kind::Note) {
      std::string note = m.note;
      if (size_t at = note.find("{value}"); at != std::string::npos) note.replace(at, 7, v);
      return cat(": ", note);
    }
    const std::string suggestion = cat(dashed(m.flag), v.empty() ? "" : " ", v);
    if (has(m.flag)) return cat("; did you mean ", suggestion, "? (tpc's name for ", theirs, m.note, ")");
    if (m.kind == Kind::ModelFile)
      return cat(": the model file holds ", theirs, "; write one with `tpc new gpt --preset NAME ", suggestion,
                 " -o MODEL.fb`");
    break;  // tpc's flag is another sub-command's: at most a typo of this one's
  }
  std::vector<std::string> candidates = known;
  candidates.push_back("help");
  if (std::string close = closestFlag(spelled, candidates); !close.empty())
    return cat("; did you mean ", dashed(close), "? (see 'tpc ", command, " --help')");
  return "";
}

}  // namespace tpc::cli
