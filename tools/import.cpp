// `tpc import --hf DIR -o gpt.fb`: a Hugging Face GPT-2 (config.json + model.safetensors) as a tpc model file
// plus its weights as a checkpoint (gpt.fb.weights), to fine-tune with `tpc run gpt.fb --load gpt.fb.weights
// --finetune`.
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iostream>

#include "frontend/model_file.h"
#include "frontend/tokenizer.h"
#include "ir/file_io.h"
#include "llvm/ADT/StringRef.h"
#include "models/gpt.h"
#include "runtime/checkpoint.h"
#include "tools/cli.h"
#include "tools/hf_gpt2.h"
#include "tools/output_paths.h"
#include "tools/train_flags.h"

namespace tpc {
namespace {

int runImport(std::vector<std::string> args) {
  cli::Flags flags("import",
                   "tpc import --hf DIR -o MODEL.fb [training flags]\n\n"
                   "Reads a Hugging Face GPT-2 directory (config.json, model.safetensors) and writes MODEL.fb and the\n"
                   "weights as the checkpoint MODEL.fb.weights. Fine-tune with:\n"
                   "  tpc run MODEL.fb --load MODEL.fb.weights --finetune");
  flags.value("hf", "the Hugging Face model directory to read")
      .value("o", "the model file to write (.fb or .json)")
      .value("tokenizer", "gpt2 | byte (default: gpt2 for a 50257-token vocabulary, byte for 257)");
  cli::declareTrainingFlags(flags);
  int rc = 0;
  if (!flags.parse(args, rc)) return rc;
  if (!flags.has("hf") || !flags.has("o")) return cli::fail("import", "--hf DIR and -o MODEL.fb are required");
  if (!flags.positional().empty()) return cli::fail("import", "unexpected argument '" + flags.positional()[0] + "'");
  const std::string out = flags.get("o"), weights = out + ".weights";
  // The model file and its weights folder, checked before anything is written.
  if (Status s = cli::checkOutputFile("-o", out); !s.ok()) return cli::fail("import", s.error());
  for (const char* input : {"config.json", "model.safetensors"})
    if (cli::sameFile(out, std::filesystem::path(flags.get("hf")) / input))
      return cli::fail("import", cat("-o ", out, ": error: is the ", input, " that --hf reads; name another model file"));
  std::error_code ec;
  const bool weightsExisted = std::filesystem::exists(weights, ec);
  if (weightsExisted && !std::filesystem::is_directory(weights, ec))
    return cli::fail("import", cat(weights, ": error: exists and is not a folder; the weights of -o ", out,
                                   " go there: remove it or name another -o"));
  // An earlier import's weights (iteration 0) are replaced; a run's checkpoints are not touched.
  std::string latest;
  if (std::ifstream f(weights + "/latest_checkpointed_iteration.txt"); f) std::getline(f, latest);
  if (weightsExisted && !std::filesystem::is_empty(weights, ec) && latest != "0")
    return cli::fail("import", cat(weights, ": error: holds other checkpoints than an imported one; the weights of -o ",
                                   out, " go there: remove it or name another -o"));
  auto hf = readHfGpt2(flags.get("hf"));
  if (!hf) return cli::fail("import", hf.error());
  for (const auto& [name, t] : hf->tensors)
    if (Status s = requireFiniteWeights(t, flags.get("hf") + "/model.safetensors", hf->hfNames.at(name),
                                        "a model with non-finite weights cannot be trained or sampled");
        !s.ok())
      return cli::fail("import", s.error());
  if (!hf->defaults.empty()) {
    std::string list;
    for (const std::string& d : hf->defaults) list += (list.empty() ? "" : ", ") + d;
    std::cerr << flags.get("hf") << "/config.json: note: took transformers' GPT2Config defaults for the fields it lacks: "
              << list << "\n";
  }
  const GptConfig& gpt = hf->gpt;
  const std::map<std::string, HostTensor>& tensors = hf->tensors;
  TrainConfig config;
  config.seqLength = std::min<int64_t>(gpt.positions, 1024);
  config.microBatch = config.globalBatch = 8;
  config.tokenizer = flags.has("tokenizer") ? flags.get("tokenizer") : gpt.vocab == 257 ? "byte" : "gpt2";
  // Said as the flag given: validation below would name the model file's config.tokenizer_type.
  if (const auto names = tokenizerNames(); std::find(names.begin(), names.end(), config.tokenizer) == names.end())
    return cli::fail("import", cat("--tokenizer ", config.tokenizer, ": expected gpt2 or byte"));
  if (config.tokenizer == "byte") config.dataPath = "data/brown/brown_byte";
  if (Status s = cli::applyTrainingFlags(flags, config); !s.ok()) return cli::fail("import", s.error());
  // What `tpc run` would refuse of the written model, refused before anything is written.
  if (!(out.size() > 3 && out.compare(out.size() - 3, 3, ".fb") == 0) && !(out.size() > 5 && out.compare(out.size() - 5, 5, ".json") == 0))
    return cli::fail("import", cat("-o ", out, ": error: unknown model file extension (expected .fb or .json)"));
  // The tokenizer's ids must all be rows of the embedding (tpc sample and tpc run refuse the model otherwise).
  const int64_t tokenizerIds = tokenizerIdCount(config.tokenizer);
  if (flags.has("tokenizer") && gpt.vocab < tokenizerIds)
    return cli::fail("import", cat("--tokenizer ", config.tokenizer, " needs a vocabulary of at least ", tokenizerIds,
                                   " tokens; this model has ", gpt.vocab,
                                   gpt.vocab >= 257 ? " (use --tokenizer byte for 257)" : ""));
  if (gpt.vocab < tokenizerIds)
    return cli::fail("import", cat(flags.get("hf"), "/config.json: error: vocab_size=", gpt.vocab,
                                   gpt.vocab < 257 ? " is smaller than both of tpc's tokenizers (byte: 257 ids, gpt2: 50257)"
                                                   : " is not GPT-2's 50257 (tpc's gpt2 tokenizer); if ids 0-255 are bytes "
                                                     "and 256 ends a document, pass --tokenizer byte"));
  if (config.tp > 1 && gpt.heads % config.tp != 0)
    return cli::fail("import", cat("--tp ", config.tp, " does not divide the model's ", gpt.heads,
                                   " attention heads; pick a tp that does"));
  // Checked here, where the flags are known, so that errors name the flag given (--lr), not the model file's field.
  if (Status s = cli::validateTrainingFlags(flags, config, &gpt); !s.ok()) return cli::fail("import", s.error());
  auto model = buildGpt(gpt, config);
  if (!model) return cli::fail("import", model.error());
  const std::string stPath = flags.get("hf") + "/model.safetensors";
  std::vector<CheckpointTensor> layout;
  int64_t count = 0;
  for (const Value* p : model->forward->params()) {
    Shape shape = gptStoredShape(gpt, p->name(), p->shape());
    auto it = tensors.find(p->name());
    if (it == tensors.end())
      return cli::fail("import", cat(stPath, ": error: tensor ", hfNameOf(p->name()), " is missing"));
    if (it->second.shape() != shape)
      return cli::fail("import", cat(stPath, ": error: tensor ", hfNameOf(p->name()), " is ", it->second.type().str(),
                                     ", config.json implies ", TensorType(DType::f32, shape).str()));
    layout.push_back({p->name(), shape});
    count += it->second.numel();
  }
  // A tensor the model has no place for means config.json and the weights disagree (a layer past n_layer) or
  // another architecture's head or adapter: dropping it would import a different model than the one on disk.
  if (layout.size() != tensors.size())
    for (const auto& [name, t] : tensors)
      if (std::none_of(layout.begin(), layout.end(), [&](const CheckpointTensor& c) { return c.name == name; })) {
        std::string why = "is not a GPT-2 (GPT2LMHeadModel) parameter tpc knows; tpc imports GPT-2 models only";
        llvm::StringRef rest(name);
        long long layer = -1;
        if (rest.consume_front("h.") && !rest.split('.').first.getAsInteger(10, layer) && layer >= gpt.layers)
          why = cat("is of layer ", layer, ", but config.json has n_layer=", gpt.layers,
                    "; config.json and the weights disagree");
        return cli::fail("import", cat(stPath, ": error: tensor ", hf->hfNames.at(name), " ", why));
      }
  auto bytes = serializeModel(*model, false);
  if (!bytes) return cli::fail("import", bytes.error());
  auto outBytes = llvm::StringRef(out).endswith(".json") ? serializeModel(*model, true) : bytes;
  if (!outBytes) return cli::fail("import", cat(out, ": error: ", outBytes.error()));
  CheckpointState st;
  st.seed = config.seed;
  st.model = out;
  st.config = "imported from " + flags.get("hf");
  // The weights (their iter_0000000 folder and latest file) and the model file replace an earlier import's together:
  // a failure or Ctrl-C between them never leaves new weights beside an old model file, or the reverse.
  RemoveOnError madeWeights(weightsExisted ? std::filesystem::path() : std::filesystem::path(weights));
  std::filesystem::create_directories(weights, ec);
  if (ec) return cli::fail("import", cat(weights, ": error: cannot create: ", ec.message()));
  FileCommit commit;
  Status s = stageCheckpoint(commit, weights, st, layout,
                             [&](const std::string& n) -> Result<HostTensor> { return tensors.at(n); },
                             {{"model.fb", *bytes}});
  if (s.ok()) s = commit.write(out, *outBytes);
  if (s.ok()) s = commit.commit();
  if (!s.ok()) return cli::fail("import", s.error());  // no weights folder it made left without its model file
  madeWeights.keep();
  // tpc's tokenizer fixes where documents end; a model trained to end them elsewhere is told so, not silently kept.
  for (const auto& [key, id] : hf->endIds)
    if (id != hfEndOfDocumentId(config.tokenizer))
      std::cerr << flags.get("hf") << "/config.json: note: " << key << "=" << id << " is not the end-of-document id of "
                << "tpc's " << config.tokenizer << " tokenizer (" << hfEndOfDocumentId(config.tokenizer) << "), which "
                << "tpc run and tpc sample use\n";
  std::cout << "wrote " << out << " (GPT-2: " << gpt.layers << " layers, hidden " << gpt.hidden << ", " << gpt.heads
            << " heads, vocab " << gpt.vocab << "; " << count << " parameters) and its weights " << out
            << ".weights\nfine-tune with: tpc run " << out << " --load " << out << ".weights --finetune\n";
  return 0;
}

cli::SubcommandRegistration reg("import", "read a Hugging Face GPT-2 into a model file and weights", runImport);

}  // namespace
}  // namespace tpc
