// `tpc new gpt`: writes a model file (.fb or .json) from a preset, with hyperparameters overridden by flags.
#include <filesystem>
#include <iostream>

#include "frontend/tokenizer.h"
#include "frontend/data_blend.h"
#include "frontend/model_file.h"
#include "models/gpt.h"
#include "tools/cli.h"
#include "tools/output_paths.h"
#include "tools/train_flags.h"

namespace tpc {
namespace {


int runNew(std::vector<std::string> args) {
  std::string presets;
  for (const std::string& p : gptPresetNames()) presets += (presets.empty() ? "" : "|") + p;
  cli::Flags flags("new", "tpc new gpt --preset " + presets + " [overrides] -o MODEL.fb|MODEL.json");
  flags.value("preset", "the starting point (models/presets/NAME.json)", "tiny")
      .value("o", "the model file to write; .fb (binary) or .json by extension")
      .value("layers", "number of transformer blocks")
      .value("hidden", "hidden size (n_embd)")
      .value("heads", "attention heads (must divide --hidden)")
      .value("vocab", "vocabulary size")
      .value("padded-vocab", "rows of the embedding table (0: vocab rounded up to 128)")
      .value("positions", "size of the position table (the longest sequence)")
      .value("seq", "training sequence length (<= positions)")
      .value("micro-batch-size", "sequences per micro batch")
      .value("global-batch-size", "sequences per optimizer step")
      .value("hidden-dropout", "dropout on embeddings, attention and MLP outputs")
      .value("attention-dropout", "dropout on attention probabilities")
      .value("lr", "peak learning rate")
      .value("min-lr", "final learning rate")
      .value("train-iters", "optimizer steps")
      .words("data-path", "indexed dataset prefix, or a blend as in Megatron-LM ('0.3 web 0.7 books', 'web books')");
  int rc = 0;
  if (!flags.parse(args, rc)) return rc;
  // --data-path takes the words up to the next option: a word of the command line that landed there is named.
  if (flags.has("data-path")) {
    // The blend's form is checked here rather than at the first run of the file (its datasets may not exist yet).
    auto blend = parseDataBlend(flags.get("data-path"), [](const std::string& p) {
      std::error_code ec;
      return std::filesystem::is_regular_file(p + ".idx", ec);
    });
    if (!blend) return cli::fail("new", blend.error());
    for (const DataBlendEntry& e : *blend)
      if (e.prefix == "gpt" || looksLikeModelFile(e.prefix))
        return cli::fail("new", cat("'", e.prefix, "' was read as a dataset prefix of --data-path (the words after it up "
                                    "to the next option are all prefixes); put it before --data-path: tpc new gpt "
                                    "--preset tiny --data-path PREFIX -o gpt.fb"));
  }
  if (flags.positional().empty() || flags.positional()[0] != "gpt")
    return cli::fail("new", "expected the architecture 'gpt' (tpc new gpt --preset tiny -o gpt.fb)");
  if (flags.positional().size() > 1)
    return cli::fail("new", "unexpected argument '" + flags.positional()[1] + "' (tpc new gpt --preset tiny -o gpt.fb)");
  if (!flags.has("o")) return cli::fail("new", "-o MODEL.fb or -o MODEL.json is required");
  if (Status s = cli::checkOutputFile("-o", flags.get("o")); !s.ok()) return cli::fail("new", s.error());

  auto preset = gptPreset(flags.get("preset"));
  if (!preset) return cli::fail("new", "--preset: " + preset.error());
  GptConfig gpt = preset->gpt;
  TrainConfig config = preset->config;
  struct IntFlag {
    const char* name;
    int64_t* field;
    long long lo;
  };
  for (const IntFlag& f : {IntFlag{"layers", &gpt.layers, 1}, IntFlag{"hidden", &gpt.hidden, 1}, IntFlag{"heads", &gpt.heads, 1},
                           IntFlag{"vocab", &gpt.vocab, 1}, IntFlag{"padded-vocab", &gpt.paddedVocab, 0},
                           IntFlag{"positions", &gpt.positions, 1}, IntFlag{"seq", &config.seqLength, 1},
                           IntFlag{"micro-batch-size", &config.microBatch, 1},
                           IntFlag{"global-batch-size", &config.globalBatch, 1}, IntFlag{"train-iters", &config.trainIters, 1}}) {
    if (!flags.has(f.name)) continue;
    auto v = flags.getInt(f.name, f.lo, int64_t(1) << 40);
    if (!v) return cli::fail("new", v.error());
    *f.field = *v;
  }
  if (flags.has("vocab")) {
    // A new vocabulary gets its own padding: the preset's padded vocab is for the preset's vocab.
    if (!flags.has("padded-vocab")) gpt.paddedVocab = 0;
    // Every id of the preset's tokenizer needs an embedding row (byte: 256 bytes + end of document).
    const int64_t tokens = tokenizerIdCount(config.tokenizer);
    if (gpt.vocab < tokens)
      return cli::fail("new", cat("--vocab ", gpt.vocab, " is smaller than the ", config.tokenizer, " tokenizer's ", tokens,
                                  " tokens (preset ", flags.get("preset"), "); give --vocab ", tokens, " or more"));
  }
  // A micro batch given alone keeps one micro batch per step.
  if (flags.has("micro-batch-size") && !flags.has("global-batch-size")) config.globalBatch = config.microBatch;
  for (auto [name, field] : {std::pair{"hidden-dropout", &gpt.hiddenDropout}, std::pair{"attention-dropout", &gpt.attentionDropout},
                             std::pair{"lr", &config.lr}, std::pair{"min-lr", &config.minLr}}) {
    if (!flags.has(name)) continue;
    auto v = flags.getDouble(name);
    if (!v) return cli::fail("new", v.error());
    *field = *v;
  }
  if (flags.has("data-path")) config.dataPath = flags.get("data-path");

  // Errors name the flag given (--lr, --seq, --heads), not the field of the model file it would have written
  // (config.lr, config.seq_length, arch.heads).
  const cli::RenamedFlags renamed{{"seq_length", "seq"},
                                  {"arch.layers", "layers"},
                                  {"arch.hidden", "hidden"},
                                  {"arch.heads", "heads"},
                                  {"arch.vocab", "vocab"},
                                  {"arch.padded_vocab", "padded-vocab"},
                                  {"arch.positions", "positions"},
                                  {"arch.hidden_dropout", "hidden-dropout"},
                                  {"arch.attention_dropout", "attention-dropout"}};
  if (Status s = cli::validateTrainingFlags(flags, config, &gpt, renamed); !s.ok()) return cli::fail("new", s.error());
  auto model = buildGpt(gpt, config);
  if (!model) return cli::fail("new", model.error());
  if (Status s = saveModelFile(*model, flags.get("o")); !s.ok()) return cli::fail("new", s.error());
  return 0;
}

cli::SubcommandRegistration reg("new", "write a GPT model file (.fb or .json) from a preset", runNew);

}  // namespace
}  // namespace tpc
