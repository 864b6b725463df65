#include "tools/hf_gpt2.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <unistd.h>

#include "frontend/byte_tokenizer.h"
#include "ir/attr.h"
#include "ir/file_io.h"
#include "ir/json_text.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/JSON.h"
#include "runtime/safetensors.h"

namespace tpc {
namespace fs = std::filesystem;

std::string hfNameOf(const std::string& n) {
  if (n == "wte" || n == "wpe") return "transformer." + n + ".weight";
  return "transformer." + n;
}

std::string tpcNameOfHf(const std::string& hf) {
  llvm::StringRef n(hf);
  n.consume_front("transformer.");
  if (n == "lm_head.weight" || n.endswith(".attn.bias") || n.endswith(".attn.masked_bias")) return "";
  if (n == "wte.weight" || n == "wpe.weight") return n.drop_back(7).str();
  return n.str();
}

int64_t hfEndOfDocumentId(const std::string& tokenizer) { return tokenizer == "byte" ? ByteTokenizer::kEod : 50256; }

std::string hfConfigJson(const GptConfig& g, const std::string& tokenizer) {
  // The end-of-document id, not the last row: a vocabulary padded past the tokenizer's (50304 for gpt2, 1000 for
  // byte) still ends documents with <|endoftext|>. GPT-2's encoder.json puts it at 50256.
  const int64_t eod = hfEndOfDocumentId(tokenizer);
  llvm::json::Object o{{"architectures", llvm::json::Array{"GPT2LMHeadModel"}},
                       {"model_type", "gpt2"},
                       {"vocab_size", g.vocab},
                       {"n_positions", g.positions},
                       {"n_ctx", g.positions},
                       {"n_embd", g.hidden},
                       {"n_layer", g.layers},
                       {"n_head", g.heads},
                       {"n_inner", nullptr},
                       {"activation_function", "gelu_new"},
                       {"layer_norm_epsilon", g.layerNormEps},
                       {"initializer_range", g.initStd},
                       {"resid_pdrop", g.hiddenDropout},
                       {"embd_pdrop", g.hiddenDropout},
                       {"attn_pdrop", g.attentionDropout},
                       {"tie_word_embeddings", true},
                       {"scale_attn_weights", true},
                       {"bos_token_id", eod},
                       {"eos_token_id", eod},
                       {"torch_dtype", "float32"}};
  std::string out;
  llvm::raw_string_ostream os(out);
  os << llvm::formatv("{0:2}", llvm::json::Value(std::move(o))) << "\n";
  return os.str();
}

Result<GptConfig> parseHfConfig(const std::string& path, const std::string& text, std::vector<std::string>* defaulted) {
  auto v = parseJsonText(text);
  if (!v.ok()) return makeError(path, ": error: ", v.error());
  const llvm::json::Object* o = v->getAsObject();
  if (!o) return makeError(path, ": error: not a JSON object");
  auto type = o->getString("model_type");
  if (!type || *type != "gpt2")
    return makeError(path, ": error: model_type is '", type ? type->str() : std::string("(missing)"),
                     "', not 'gpt2': tpc imports GPT-2 models (GPT2LMHeadModel) only");
  // A field present with the wrong kind is refused, not read as absent: transformers reads "scale_attn_weights": 0
  // or null as false, and the default in its place would import a different model.
  for (const char* key : {"activation_function", "tie_word_embeddings", "scale_attn_weights",
                          "scale_attn_by_inverse_layer_idx", "reorder_and_upcast_attn"}) {
    const llvm::json::Value* v = o->get(key);
    const bool text = llvm::StringRef(key) == "activation_function";
    if (v && (text ? !v->getAsString() : !v->getAsBoolean()))
      return makeError(path, ": error: ", key, text ? " is not a string" : " is not true or false");
  }
  // gelu_pytorch_tanh is the same tanh approximation as gelu_new, computed by PyTorch's kernel.
  if (auto act = o->getString("activation_function"); act && *act != "gelu_new" && *act != "gelu_pytorch_tanh")
    return makeError(path, ": error: activation_function '", act->str(), "' is not gelu_new (GPT-2's tanh GELU)");
  if (auto tie = o->getBoolean("tie_word_embeddings"); tie && !*tie)
    return makeError(path, ": error: tie_word_embeddings is false; tpc's GPT ties the LM head to wte");
  GptConfig g;
  std::vector<std::string> defaults;
  // The fields every GPT2Config has, with its defaults where config.json lacks them (a hand-written or trimmed
  // config.json; save_pretrained writes them all). GPT2Config's attribute_map reads an alias (hidden_size) for
  // the field (n_embd); both given and different is refused rather than one picked.
  auto need = [&](const char* key, const char* alias, int64_t def, int64_t& field, int64_t max) -> Status {
    const llvm::json::Value* a = alias ? o->get(alias) : nullptr;
    if (a && !o->get(key)) key = alias;
    else if (a && *a != *o->get(key))
      return makeError(path, ": error: ", key, " and ", alias, " are two names of one field and disagree; keep one");
    if (!o->get(key)) {
      field = def;
      defaults.push_back(cat(key, "=", def));
      return {};
    }
    // `max`: validateGpt's bound for the field. A number past int64 reads as a double (or a clamped integer).
    auto x = o->getInteger(key);
    auto d = o->getNumber(key);
    if (x ? *x > max : d && *d > double(max) && std::floor(*d) == *d)
      return makeError(path, ": error: ", key, " is out of range [1, ", max, "]");
    if (!x || *x <= 0) return makeError(path, ": error: ", key, " must be a positive integer");
    field = *x;
    return {};
  };
  TPC_TRY(need("n_layer", "num_hidden_layers", 12, g.layers, kMaxGptLayers));
  TPC_TRY(need("n_embd", "hidden_size", 768, g.hidden, kMaxGptHidden));
  TPC_TRY(need("n_head", "num_attention_heads", 12, g.heads, kMaxGptHeads));
  TPC_TRY(need("vocab_size", nullptr, 50257, g.vocab, kMaxGptVocab));
  TPC_TRY(need("n_positions", "max_position_embeddings", 1024, g.positions, kMaxGptPositions));
  // A value config.json lacks is said to be GPT2Config's default (the note naming the defaults comes only after
  // a config that loads).
  auto shown = [&](const char* key, int64_t v) {
    const std::string given = cat(key, "=", v);
    const bool defaulted = std::find(defaults.begin(), defaults.end(), given) != defaults.end();
    return defaulted ? cat(given, " (GPT2Config's default: config.json has no ", key, ")") : given;
  };
  if (g.hidden % g.heads != 0)
    return makeError(path, ": error: ", shown("n_head", g.heads), " must divide ", shown("n_embd", g.hidden));
  if (const llvm::json::Value* inner = o->get("n_inner"); inner && inner->kind() != llvm::json::Value::Null)
    if (inner->getAsInteger() != 4 * g.hidden)
      return makeError(path, ": error: n_inner must be null or 4 x n_embd = ", 4 * g.hidden, " (tpc's GPT MLP)");
  // Attention variants of GPT2Model that tpc's GPT does not compute (reorder_and_upcast_attn only changes the
  // precision of the same product, so it is accepted).
  if (auto scale = o->getBoolean("scale_attn_weights"); scale && !*scale)
    return makeError(path, ": error: scale_attn_weights is false; tpc's attention always scales by 1/sqrt(head dim)");
  if (auto byLayer = o->getBoolean("scale_attn_by_inverse_layer_idx"); byLayer && *byLayer)
    return makeError(path, ": error: scale_attn_by_inverse_layer_idx is true; tpc's attention does not scale by layer");
  // `ok` and `range`: what validateGpt requires of the field, said with config.json's name for it.
  auto number = [&](const char* key, double def, double& field, bool (*ok)(double), const char* range) -> Status {
    const llvm::json::Value* x = o->get(key);
    field = def;
    if (!x || x->kind() == llvm::json::Value::Null) {
      defaults.push_back(cat(key, "=", formatFloat(def)));
      return {};
    }
    if (!x->getAsNumber()) return makeError(path, ": error: ", key, " is not a number");
    field = *x->getAsNumber();
    if (!ok(field)) return makeError(path, ": error: ", key, " must be ", range, ", got ", formatFloat(field));
    return {};
  };
  auto positive = [](double x) { return x > 0 && std::isfinite(x); };
  auto nonNegative = [](double x) { return x >= 0 && std::isfinite(x); };
  auto probability = [](double x) { return x >= 0 && x < 1; };
  TPC_TRY(number("layer_norm_epsilon", 1e-5, g.layerNormEps, positive, "> 0"));
  TPC_TRY(number("initializer_range", 0.02, g.initStd, nonNegative, ">= 0"));
  TPC_TRY(number("resid_pdrop", 0.1, g.hiddenDropout, probability, "in [0, 1)"));
  TPC_TRY(number("attn_pdrop", 0.1, g.attentionDropout, probability, "in [0, 1)"));
  // One dropout of tpc's GPT (arch.hidden_dropout) is both of these: the export writes it to both.
  if (const llvm::json::Value* e = o->get("embd_pdrop"); e && e->kind() != llvm::json::Value::Null) {
    if (!e->getAsNumber()) return makeError(path, ": error: embd_pdrop is not a number");
    if (*e->getAsNumber() != g.hiddenDropout)
      return makeError(path, ": error: embd_pdrop ", formatFloat(*e->getAsNumber()), " differs from resid_pdrop ",
                       formatFloat(g.hiddenDropout),
                       o->get("resid_pdrop") && o->get("resid_pdrop")->kind() != llvm::json::Value::Null
                           ? ""
                           : " (GPT2Config's default: config.json has no resid_pdrop)",
                       "; tpc's GPT applies one dropout (arch.hidden_dropout) to the "
                       "embeddings and the residual branches: set both to one value in config.json");
  }
  // The defaults of the fields whose other values tpc refuses (above): named too, as the model rests on them.
  for (auto [key, def] : {std::pair{"activation_function", "\"gelu_new\""}, std::pair{"tie_word_embeddings", "true"},
                          std::pair{"scale_attn_weights", "true"}, std::pair{"n_inner", "null (4 x n_embd)"}})
    if (!o->get(key)) defaults.push_back(cat(key, "=", def));
  if (defaulted) *defaulted = std::move(defaults);
  return g;
}

Result<std::string> hfOutputDir(const std::string& path) {
  // "out/" is the folder out: without the slash the temp folder is out.tmp, beside it, not inside.
  std::string dir = path;
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  if (dir.empty()) return makeError("--hf is empty; name the Hugging Face model directory to write");
  const std::string base = fs::path(dir).filename().string();
  if (dir == "/" || base == "." || base == "..")
    return makeError("--hf ", path, ": error: name the model directory itself (e.g. --hf hf_model), not '.', '..' or '/'");
  std::error_code ec;
  if (fs::exists(dir, ec) && (!fs::is_directory(dir, ec) || (!fs::exists(fs::path(dir) / "config.json", ec) && !fs::is_empty(dir, ec))))
    return makeError(dir, ": error: exists and is not a Hugging Face model directory; not overwriting it (name another)");
  for (const char* file : {"config.json", "model.safetensors"})
    if (fs::is_directory(fs::path(dir) / file, ec))
      return makeError(dir, "/", file, ": error: is a folder where the export writes a file; remove it or name another --hf");
  return dir;
}

Status writeHfGpt2(const std::string& path, const GptConfig& gpt, const std::string& tokenizer,
                   const std::map<std::string, HostTensor>& params) {
  TPC_ASSIGN(const std::string dir, hfOutputDir(path));
  std::error_code ec;
  SafetensorsFile file;
  file.metadata["format"] = "pt";  // what transformers expects of a PyTorch checkpoint
  for (const auto& [name, t] : params) file.tensors.push_back({hfNameOf(name), t.convertTo(DType::f32)});
  if (fs::exists(fs::path(dir) / "config.json", ec)) {
    // An existing model folder keeps what else it holds (tokenizer files, a README), as save_pretrained does: only
    // the two files of the export are replaced, together, so that a failure or Ctrl-C between them never leaves new
    // weights beside an old config.
    FileCommit commit;
    TPC_TRY(writeSafetensors(commit, dir + "/model.safetensors", file));
    TPC_TRY(commit.write(dir + "/config.json", hfConfigJson(gpt, tokenizer)));
    return commit.commit();
  }
  // A name of tpc's own beside DIR (never a user's DIR.tmp): debris of an export killed midway with this process id.
  const std::string tmp = cat(dir, ".tpc-export-tmp.", getpid());
  fs::remove_all(tmp, ec);
  // The outermost folder this creates (tmp or a missing parent): removed on any failure, leaving nothing behind.
  RemoveOnError cleanup(firstMissingFolder(tmp));
  fs::create_directories(tmp, ec);
  if (ec) return makeError(tmp, ": error: cannot create: ", ec.message());
  TPC_TRY(writeSafetensors(tmp + "/model.safetensors", file));
  TPC_TRY(writeFileAtomically(tmp + "/config.json", hfConfigJson(gpt, tokenizer)));
  fs::remove_all(dir, ec);
  fs::rename(tmp, dir, ec);
  if (ec) return makeError(dir, ": error: cannot move into place: ", ec.message());
  cleanup.keep();
  return {};
}

Result<HfGpt2> readHfGpt2(const std::string& dir) {
  const std::string cfgPath = dir + "/config.json";
  std::error_code ec;
  if (fs::is_directory(cfgPath, ec)) return makeError(cfgPath, ": error: is a folder, not the model's config file");
  std::ifstream f(cfgPath);
  if (!f) return makeError(cfgPath, ": error: cannot open (is ", dir, " a Hugging Face model directory?)");
  std::stringstream ss;
  ss << f.rdbuf();
  HfGpt2 out;
  TPC_ASSIGN(out.gpt, parseHfConfig(cfgPath, ss.str(), &out.defaults));
  if (auto parsed = parseJsonText(ss.str()); parsed.ok())
    if (const llvm::json::Object* o = parsed->getAsObject())
      for (const char* key : {"bos_token_id", "eos_token_id"})
        if (auto id = o->getInteger(key)) out.endIds[key] = *id;
  const std::string stPath = dir + "/model.safetensors";
  if (!fs::exists(stPath) && fs::exists(stPath + ".index.json"))
    return makeError(stPath, ": error: missing; the weights are sharded (", stPath, ".index.json): tpc reads one file, so "
                     "save them with transformers' save_pretrained(..., max_shard_size=\"100GB\")");
  if (!fs::exists(stPath))
    return makeError(stPath, ": error: missing (tpc reads safetensors weights; convert pytorch_model.bin with "
                             "transformers' save_pretrained(safe_serialization=True))");
  TPC_ASSIGN(SafetensorsFile file, readSafetensors(stPath));
  for (auto& [hf, t] : file.tensors) {
    std::string n = tpcNameOfHf(hf);
    if (n.empty()) continue;
    if (!isFloat(t.dtype())) return makeError(stPath, ": error: tensor ", hf, " is ", t.type().str(), ", not float");
    if (auto [it, fresh] = out.hfNames.emplace(n, hf); !fresh)
      return makeError(stPath, ": error: tensors ", it->second, " and ", hf, " are the same parameter; keep one");
    out.tensors[n] = t.convertTo(DType::f32);
  }
  return out;
}

}  // namespace tpc
