// `tpc export --hf`, `tpc import --hf` and `tpc sample` (issue 8): export -> import -> export is the same
// file, an imported model fine-tunes, sampling is seeded and greedy decoding follows the dumped logits, and
// foreign or broken Hugging Face directories give one error naming the file and field.
#include <catch2/catch.hpp>

#include <signal.h>

#include <algorithm>
#include <filesystem>
#include <set>
#include <tuple>

#include "runtime/safetensors.h"
#include "test_support.h"

namespace tpc {
namespace {

test::CommandResult tpc(const std::string& args, const std::string& env = "") {
  auto r = test::runCommand(env + test::tpcBinary() + " " + args);
  INFO("tpc " << args << "\n" << r.out << r.err);
  return r;
}

// tpc run from inside `dir`, for relative paths.
test::CommandResult tpcIn(const test::TempDir& dir, const std::string& args) {
  auto r = test::runCommand("cd " + dir.path.string() + " && " + test::tpcBinary() + " " + args);
  INFO("tpc " << args << "\n" << r.out << r.err);
  return r;
}

std::set<std::string> namesIn(const std::string& folder) {
  std::set<std::string> names;
  for (const auto& e : std::filesystem::directory_iterator(folder)) names.insert(e.path().filename().string());
  return names;
}

// A checkpoint of the tiny preset after 2 steps.
std::string trainedCheckpoint(const test::TempDir& dir) {
  std::string ck = dir / "ck";
  REQUIRE(tpc("run " + test::binaryPath("models/tiny.fb") + " --threads 2 --train-iters 2 --quiet --save " + ck).exitCode ==
          0);
  return ck;
}

}  // namespace

TEST_CASE("hf: export, import and export again give the same Hugging Face files", "[hf][cli]") {
  test::TempDir dir;
  std::string ck = trainedCheckpoint(dir);
  auto e1 = tpc("export --hf " + (dir / "hf1") + " " + ck);
  REQUIRE(e1.exitCode == 0);
  CHECK(e1.out.find("28 tensors, 437888 parameters") != std::string::npos);
  auto st = readSafetensors(dir / "hf1/model.safetensors");
  REQUIRE(st.ok());
  // Hugging Face names and layouts: the real vocabulary, Conv1D weights [in, out], no lm_head (tied).
  CHECK(st->find("transformer.wte.weight")->type().str() == "f32[257,128]");
  CHECK(st->find("transformer.h.1.attn.c_attn.weight")->type().str() == "f32[128,384]");
  CHECK(st->find("transformer.ln_f.bias")->type().str() == "f32[128]");
  CHECK(st->find("lm_head.weight") == nullptr);
  std::string config = test::readFile(dir / "hf1/config.json");
  CHECK(config.find("\"model_type\": \"gpt2\"") != std::string::npos);
  CHECK(config.find("\"n_layer\": 2") != std::string::npos);

  auto imp = tpc("import --hf " + (dir / "hf1") + " -o " + (dir / "re.fb"));
  REQUIRE(imp.exitCode == 0);
  CHECK(imp.out.find("fine-tune with: tpc run") != std::string::npos);
  // The import's training flags go into the model file, --recompute too.
  REQUIRE(tpc("import --hf " + (dir / "hf1") + " -o " + (dir / "full.json") + " --recompute full").exitCode == 0);
  CHECK(test::readFile(dir / "full.json").find("\"recompute\": \"full\"") != std::string::npos);
  CHECK(tpc("dump " + (dir / "full.json") + " --print-pipeline").out.find(",recompute(mode=full)") != std::string::npos);
  CHECK(tpc("dump " + (dir / "re.fb") + " --print-pipeline").out.find("recompute") == std::string::npos);
  REQUIRE(tpc("export --hf " + (dir / "hf2") + " " + (dir / "re.fb.weights")).exitCode == 0);
  CHECK(test::readFile(dir / "hf1/model.safetensors") == test::readFile(dir / "hf2/model.safetensors"));

  // The imported model fine-tunes; without --finetune the missing AdamW state is named.
  auto noMoments = tpc("run " + (dir / "re.fb") + " --threads 2 --train-iters 2 --load " + (dir / "re.fb.weights"));
  CHECK(noMoments.exitCode == 1);
  CHECK(noMoments.err.find("tensor wte.adam_m is missing") != std::string::npos);
  CHECK(noMoments.err.find("add --finetune") != std::string::npos);
  auto ft = tpc("run " + (dir / "re.fb") + " --threads 2 --train-iters 2 --log-interval 1 --finetune --load " +
                (dir / "re.fb.weights"));
  CHECK(ft.exitCode == 0);
  CHECK(ft.out.find("step      2/2 | loss") != std::string::npos);
}

TEST_CASE("hf: foreign or broken Hugging Face directories are refused by name", "[hf][cli]") {
  test::TempDir dir;
  std::string ck = trainedCheckpoint(dir);
  REQUIRE(tpc("export --hf " + (dir / "hf") + " " + ck).exitCode == 0);
  std::string good = test::readFile(dir / "hf/config.json");
  auto fail = [&](const std::string& expected) {
    auto r = tpc("import --hf " + (dir / "hf") + " -o " + (dir / "x.fb"));
    CHECK(r.exitCode == 1);
    CHECK(std::count(r.err.begin(), r.err.end(), '\n') == 1);
    CHECK(r.err.find(expected) != std::string::npos);
    CHECK(!std::filesystem::exists(dir / "x.fb"));  // nothing written
  };
  std::string llama = good;
  llama.replace(llama.find("\"gpt2\""), 6, "\"llama\"");
  test::writeFile(dir / "hf/config.json", llama);
  fail("config.json: error: model_type is 'llama', not 'gpt2'");
  std::string wide = good;
  wide.replace(wide.find("\"n_embd\": 128"), 13, "\"n_embd\": 256");
  test::writeFile(dir / "hf/config.json", wide);
  fail("model.safetensors: error: tensor transformer.wte.weight is f32[257,128], config.json implies f32[257,256]");
  std::string huge = good;
  huge.replace(huge.find("\"n_embd\": 128"), 13, "\"n_embd\": 99999999999999999999");
  test::writeFile(dir / "hf/config.json", huge);
  fail("config.json: error: n_embd is out of range [1, 1048576]");
  // GPT2Model options tpc's GPT does not compute, and a field of the wrong kind, are named rather than dropped.
  for (auto [from, to, expected] : std::vector<std::tuple<std::string, std::string, std::string>>{
           {"\"scale_attn_weights\": true", "\"scale_attn_weights\": false", "error: scale_attn_weights is false"},
           {"\"scale_attn_weights\": true", "\"scale_attn_by_inverse_layer_idx\": true",
            "error: scale_attn_by_inverse_layer_idx is true"},
           {"\"layer_norm_epsilon\": ", "\"layer_norm_epsilon\": \"x\", \"unused\": ",
            "config.json: error: layer_norm_epsilon is not a number"}}) {
    std::string changed = good;
    REQUIRE(changed.find(from) != std::string::npos);
    changed.replace(changed.find(from), from.size(), to);
    test::writeFile(dir / "hf/config.json", changed);
    fail(expected);
  }
  test::writeFile(dir / "hf/config.json", good);
  // Sharded weights get the fix for sharded weights.
  std::filesystem::rename(dir / "hf/model.safetensors", dir / "hf/model-00001-of-00001.safetensors");
  test::writeFile(dir / "hf/model.safetensors.index.json", "{}");
  fail("the weights are sharded");
  std::filesystem::remove(dir / "hf/model.safetensors.index.json");
  std::filesystem::rename(dir / "hf/model-00001-of-00001.safetensors", dir / "hf/model.safetensors");
  // What `tpc run` would refuse of the written model is refused before anything is written.
  for (auto [flags, expected] : std::vector<std::pair<std::string, std::string>>{
           {" --tp 3", "--tp 3 does not divide the model's 4 attention heads"},
           {" --tokenizer gpt2", "--tokenizer gpt2 needs a vocabulary of at least 50257 tokens; this model has 257"},
           {" --tokenizer gpt-2", "tpc import: error: --tokenizer gpt-2: expected gpt2 or byte\n"},
           {" --tp 99999999999999999999", "tpc import: error: --tp=99999999999999999999 is out of range [1, 1099511627776]"},
           // Named as the flag given, not as the model file's config.* field.
           {" --lr -1", "tpc import: error: --lr must be > 0.0, got -1.0\n"},
           {" --seq-length 2048", "tpc import: error: --seq-length=2048 is longer than the position table"}}) {
    auto r = tpc("import --hf " + (dir / "hf") + " -o " + (dir / "x.fb") + flags);
    CHECK(r.exitCode == 1);
    CHECK(r.err.find(expected) != std::string::npos);
    CHECK(!std::filesystem::exists(dir / "x.fb"));
    CHECK(!std::filesystem::exists(dir / "x.fb.weights"));
  }
  auto txt = tpc("import --hf " + (dir / "hf") + " -o " + (dir / "x.txt"));
  CHECK(txt.exitCode == 1);
  CHECK(txt.err.find("unknown model file extension") != std::string::npos);
  CHECK(!std::filesystem::exists(dir / "x.txt.weights"));
  auto st = readSafetensors(dir / "hf/model.safetensors");
  REQUIRE(st.ok());
  st->tensors.erase(std::find_if(st->tensors.begin(), st->tensors.end(),
                                 [](const auto& t) { return t.first == "transformer.h.0.mlp.c_fc.bias"; }));
  REQUIRE(writeSafetensors(dir / "hf/model.safetensors", *st).ok());
  fail("tensor transformer.h.0.mlp.c_fc.bias is missing");
  auto noCk = tpc("export --hf " + (dir / "out") + " " + (dir / "nothing"));
  CHECK(noCk.exitCode == 1);
  CHECK(noCk.err.find("no such checkpoint directory") != std::string::npos);
}

TEST_CASE("hf: config.json fields are checked as config.json names them, and a wrong kind is not a default", "[hf][cli]") {
  test::TempDir dir;
  std::string ck = trainedCheckpoint(dir);
  REQUIRE(tpc("export --hf " + (dir / "hf") + " " + ck).exitCode == 0);
  const std::string good = test::readFile(dir / "hf/config.json");
  for (auto [from, to, expected] : std::vector<std::tuple<std::string, std::string, std::string>>{
           // transformers reads 0 or null as false: not scaling the attention, not tying the head.
           {"\"scale_attn_weights\": true", "\"scale_attn_weights\": 0", "scale_attn_weights is not true or false"},
           {"\"tie_word_embeddings\": true", "\"tie_word_embeddings\": null", "tie_word_embeddings is not true or false"},
           {"\"activation_function\": \"gelu_new\"", "\"activation_function\": 5", "activation_function is not a string"},
           // What validateGpt refuses, said with config.json's names rather than the model file's arch.* ones.
           {"\"n_head\": 4", "\"n_head\": 5", "n_head=5 must divide n_embd=128"},
           {"\"resid_pdrop\": 0", "\"resid_pdrop\": 1", "resid_pdrop must be in [0, 1), got 1.0"},
           {"\"attn_pdrop\": 0", "\"attn_pdrop\": -0.5", "attn_pdrop must be in [0, 1), got -0.5"},
           // One dropout of tpc's (arch.hidden_dropout) is both embd_pdrop and resid_pdrop.
           {"\"embd_pdrop\": 0", "\"embd_pdrop\": 0.2", "embd_pdrop 0.2 differs from resid_pdrop 0.0; tpc's GPT applies one "
            "dropout (arch.hidden_dropout) to the embeddings and the residual branches: set both to one value in config.json"},
           {"\"layer_norm_epsilon\": ", "\"layer_norm_epsilon\": 0, \"x\": ", "layer_norm_epsilon must be > 0, got 0.0"},
           {"\"initializer_range\": ", "\"initializer_range\": -1, \"x\": ", "initializer_range must be >= 0, got -1.0"}}) {
    std::string changed = good;
    REQUIRE(changed.find(from) != std::string::npos);
    changed.replace(changed.find(from), from.size(), to);
    test::writeFile(dir / "hf/config.json", changed);
    auto r = tpc("import --hf " + (dir / "hf") + " -o " + (dir / "x.fb"));
    CHECK(r.exitCode == 1);
    CHECK(r.err == dir / "hf/config.json" + ": error: " + expected + "\n");
    CHECK(!std::filesystem::exists(dir / "x.fb"));
  }
  // PyTorch's tanh GELU is GPT-2's gelu_new under another name.
  std::string tanh = good;
  tanh.replace(tanh.find("\"gelu_new\""), 10, "\"gelu_pytorch_tanh\"");
  test::writeFile(dir / "hf/config.json", tanh);
  CHECK(tpc("import --hf " + (dir / "hf") + " -o " + (dir / "x.fb")).exitCode == 0);
}

namespace {
// `json` (config.json as tpc exports it: one field a line) without the line of field `key`.
std::string withoutField(std::string json, const std::string& key) {
  const size_t at = json.find("\"" + key + "\":");
  REQUIRE(at != std::string::npos);
  const size_t start = json.rfind('\n', at) + 1;
  json.erase(start, json.find('\n', at) + 1 - start);
  return json;
}
}  // namespace

TEST_CASE("hf: fields config.json lacks take transformers' GPT2Config defaults, said once", "[hf][cli]") {
  test::TempDir dir;
  // GPT2Config's default of 1024 positions, so that the weights fit the defaulted config.
  REQUIRE(tpc("new gpt --preset tiny --positions 1024 -o " + (dir / "p.fb")).exitCode == 0);
  REQUIRE(tpc("run " + (dir / "p.fb") + " --threads 2 --train-iters 1 --quiet --eval-interval 0 --save " + (dir / "ck"))
              .exitCode == 0);
  REQUIRE(tpc("export --hf " + (dir / "hf") + " " + (dir / "ck")).exitCode == 0);
  const std::string good = test::readFile(dir / "hf/config.json");
  std::string lacking = good;
  for (const char* key : {"n_positions", "n_ctx", "layer_norm_epsilon", "activation_function"})
    lacking = withoutField(lacking, key);
  test::writeFile(dir / "hf/config.json", lacking);
  auto r = tpc("import --hf " + (dir / "hf") + " -o " + (dir / "x.json"));
  CHECK(r.exitCode == 0);
  CHECK(r.err == dir / "hf/config.json" + ": note: took transformers' GPT2Config defaults for the fields it lacks: "
                                          "n_positions=1024, layer_norm_epsilon=1e-05, activation_function=\"gelu_new\"\n");
  const std::string model = test::readFile(dir / "x.json");
  CHECK(model.find("\"positions\": 1024") != std::string::npos);
  CHECK(model.find("\"layer_norm_eps\": 1e-05") != std::string::npos);
  // A defaulted field in an error is named as the default: resid_pdrop's 0.1 against the file's embd_pdrop 0.
  test::writeFile(dir / "hf/config.json", withoutField(good, "resid_pdrop"));
  auto dropout = tpc("import --hf " + (dir / "hf") + " -o " + (dir / "x.json"));
  CHECK(dropout.exitCode == 1);
  CHECK(dropout.err.find("embd_pdrop 0.0 differs from resid_pdrop 0.1 (GPT2Config's default: config.json has no "
                         "resid_pdrop); ") != std::string::npos);
  // A config.json with every field says nothing.
  test::writeFile(dir / "hf/config.json", good);
  auto full = tpc("import --hf " + (dir / "hf") + " -o " + (dir / "x.json"));
  CHECK(full.exitCode == 0);
  CHECK(full.err.empty());
  // GPT2Config's other name for a field is read as that field, not passed over for the default.
  std::string alias = withoutField(good, "n_embd");
  alias.replace(alias.find("\"n_head\""), 8, "\"hidden_size\": 128, \"n_head\"");
  test::writeFile(dir / "hf/config.json", alias);
  auto aliased = tpc("import --hf " + (dir / "hf") + " -o " + (dir / "x.json"));
  CHECK(aliased.exitCode == 0);
  CHECK(aliased.err.empty());
  alias.replace(alias.find("\"n_head\""), 8, "\"n_embd\": 256, \"n_head\"");
  test::writeFile(dir / "hf/config.json", alias);
  auto disagree = tpc("import --hf " + (dir / "hf") + " -o " + (dir / "x.json"));
  CHECK(disagree.exitCode == 1);
  CHECK(disagree.err == dir / "hf/config.json" + ": error: n_embd and hidden_size are two names of one field and "
                                                 "disagree; keep one\n");
  // A default the weights do not fit (768, not 128) is refused by the weights' shapes, after the note that says why.
  test::writeFile(dir / "hf/config.json", withoutField(good, "n_embd"));
  std::filesystem::remove(dir / "x.json");
  auto wrong = tpc("import --hf " + (dir / "hf") + " -o " + (dir / "x.json"));
  CHECK(wrong.exitCode == 1);
  CHECK(wrong.err.rfind(dir / "hf/config.json" + ": note: took transformers' GPT2Config defaults for the fields it "
                                                 "lacks: n_embd=768\n", 0) == 0);
  CHECK(wrong.err.find("config.json implies f32[") != std::string::npos);
  CHECK(!std::filesystem::exists(dir / "x.json"));
  // A default that fails a check of the config itself is named as one (n_head 12 does not divide n_embd 128).
  test::writeFile(dir / "hf/config.json", withoutField(good, "n_head"));
  auto heads = tpc("import --hf " + (dir / "hf") + " -o " + (dir / "x.json"));
  CHECK(heads.exitCode == 1);
  CHECK(heads.err == dir / "hf/config.json" + ": error: n_head=12 (GPT2Config's default: config.json has no n_head) "
                                              "must divide n_embd=128\n");
  // An end-of-document id other than the tokenizer's is said (it was taken and dropped without a word).
  std::string otherEnd = good;
  const size_t eos = otherEnd.find("\"eos_token_id\": ");
  REQUIRE(eos != std::string::npos);
  otherEnd.replace(eos, otherEnd.find_first_of(",\n}", eos) - eos, "\"eos_token_id\": 5");
  test::writeFile(dir / "hf/config.json", otherEnd);
  auto end = tpc("import --hf " + (dir / "hf") + " -o " + (dir / "x.json"));
  CHECK(end.exitCode == 0);
  CHECK(end.err == dir / "hf/config.json" + ": note: eos_token_id=5 is not the end-of-document id of tpc's byte "
                                            "tokenizer (256), which tpc run and tpc sample use\n");
}

TEST_CASE("hf: import refuses weights that config.json's model has no place for", "[hf][cli]") {
  test::TempDir dir;
  std::string ck = trainedCheckpoint(dir);
  REQUIRE(tpc("export --hf " + (dir / "hf") + " " + ck).exitCode == 0);
  const std::string good = test::readFile(dir / "hf/config.json");
  auto original = readSafetensors(dir / "hf/model.safetensors");
  REQUIRE(original.ok());
  auto withTensor = [&](const std::string& name, Shape shape) {
    SafetensorsFile f = *original;
    f.tensors.push_back({name, HostTensor(TensorType(DType::f32, shape))});
    REQUIRE(writeSafetensors(dir / "hf/model.safetensors", f).ok());
  };
  auto refused = [&](const std::string& expected) {
    auto r = tpc("import --hf " + (dir / "hf") + " -o " + (dir / "x.fb"));
    CHECK(r.exitCode == 1);
    CHECK(r.err == dir / "hf/model.safetensors" + ": error: " + expected + "\n");
    CHECK(!std::filesystem::exists(dir / "x.fb"));
    CHECK(!std::filesystem::exists(dir / "x.fb.weights"));
  };
  // Weights of 2 layers under a config of 1: not a 1-layer model with layer 1 dropped.
  std::string oneLayer = good;
  oneLayer.replace(oneLayer.find("\"n_layer\": 2"), 12, "\"n_layer\": 1");
  test::writeFile(dir / "hf/config.json", oneLayer);
  refused("tensor transformer.h.1.attn.c_attn.bias is of layer 1, but config.json has n_layer=1; config.json and the "
          "weights disagree");
  test::writeFile(dir / "hf/config.json", good);
  // Another architecture's head (GPT2ForSequenceClassification) or an adapter is named, not dropped.
  withTensor("score.weight", {2, 128});
  refused("tensor score.weight is not a GPT-2 (GPT2LMHeadModel) parameter tpc knows; tpc imports GPT-2 models only");
  withTensor("transformer.h.0.attn.c_attn.lora_A", {8, 128});
  refused("tensor transformer.h.0.attn.c_attn.lora_A is not a GPT-2 (GPT2LMHeadModel) parameter tpc knows; tpc imports "
          "GPT-2 models only");
  // One parameter under both spellings (with and without "transformer."): which one is meant is not guessed.
  withTensor("h.0.ln_1.weight", {128});
  refused("tensors transformer.h.0.ln_1.weight and h.0.ln_1.weight are the same parameter; keep one");
  // What GPT2LMHeadModel itself saves beside the parameters (the tied head, the attention mask buffer) is fine.
  withTensor("lm_head.weight", {257, 128});
  CHECK(tpc("import --hf " + (dir / "hf") + " -o " + (dir / "x.fb")).exitCode == 0);
}

TEST_CASE("hf: a vocabulary past the tokenizer's exports its end-of-document id and imports with --tokenizer", "[hf][cli]") {
  test::TempDir dir;
  // The byte tokenizer's 257 ids in a 1000-row embedding: documents still end with id 256, not the last row.
  REQUIRE(tpc("new gpt --preset tiny --vocab 1000 -o " + (dir / "v.fb")).exitCode == 0);
  REQUIRE(tpc("run " + (dir / "v.fb") + " --threads 2 --train-iters 1 --quiet --eval-interval 0 --save " + (dir / "ck"))
              .exitCode == 0);
  REQUIRE(tpc("export --hf " + (dir / "hf") + " " + (dir / "ck")).exitCode == 0);
  const std::string config = test::readFile(dir / "hf/config.json");
  CHECK(config.find("\"vocab_size\": 1000") != std::string::npos);
  CHECK(config.find("\"bos_token_id\": 256") != std::string::npos);
  CHECK(config.find("\"eos_token_id\": 256") != std::string::npos);
  // Back in: 1000 ids are not GPT-2's vocabulary, so the tokenizer is not guessed; a model neither tokenizer fits
  // is refused before anything is written, rather than written for tpc sample and tpc run to refuse.
  auto refused = [&](const std::string& flags, const std::string& expected) {
    auto r = tpc("import --hf " + (dir / "hf") + " -o " + (dir / "x.fb") + flags);
    CHECK(r.exitCode == 1);
    CHECK(r.err == expected + "\n");
    CHECK(!std::filesystem::exists(dir / "x.fb"));
    CHECK(!std::filesystem::exists(dir / "x.fb.weights"));
  };
  refused("", dir / "hf/config.json" + ": error: vocab_size=1000 is not GPT-2's 50257 (tpc's gpt2 tokenizer); if ids "
                                       "0-255 are bytes and 256 ends a document, pass --tokenizer byte");
  auto imp = tpc("import --hf " + (dir / "hf") + " -o " + (dir / "x.fb") + " --tokenizer byte");
  REQUIRE(imp.exitCode == 0);
  auto s = tpc("sample --threads 2 --load " + (dir / "x.fb.weights") + " --prompt ab --max-tokens 4");
  CHECK(s.exitCode == 0);
  CHECK(s.err.empty());
  std::filesystem::remove_all(dir / "x.fb.weights");
  std::filesystem::remove(dir / "x.fb");
  std::string small = config;
  small.replace(small.find("\"vocab_size\": 1000"), 19, "\"vocab_size\": 200");
  test::writeFile(dir / "hf/config.json", small);
  refused("", dir / "hf/config.json" + ": error: vocab_size=200 is smaller than both of tpc's tokenizers (byte: 257 ids, "
                                       "gpt2: 50257)");
  refused(" --tokenizer byte", "tpc import: error: --tokenizer byte needs a vocabulary of at least 257 tokens; this model has 200");
}

TEST_CASE("hf: bad output paths give one error and leave nothing behind", "[hf][cli]") {
  test::TempDir dir;
  std::string ck = trainedCheckpoint(dir);
  auto entries = [&] {
    std::set<std::string> names;
    for (const auto& e : std::filesystem::recursive_directory_iterator(dir.path))
      if (std::string rel = e.path().lexically_relative(dir.path).string(); rel.rfind("ck", 0) != 0) names.insert(rel);
    return names;
  };
  auto fails = [&](const std::string& args, const std::string& expected) {
    auto before = entries();
    auto r = tpcIn(dir, args);
    CHECK(r.exitCode == 1);
    CHECK(r.err == expected + "\n");
    CHECK(entries() == before);  // nothing written, no temp folder
  };
  fails("export --hf '' ck", "tpc export: error: --hf is empty; name the Hugging Face model directory to write");
  fails("export --hf . ck", "--hf .: error: name the model directory itself (e.g. --hf hf_model), not '.', '..' or '/'");
  std::filesystem::create_directory(dir / "other");
  test::writeFile(dir / "other/notes.txt", "mine");
  fails("export --hf other/ ck", "other: error: exists and is not a Hugging Face model directory; not overwriting it (name another)");
  // A trailing slash names the folder itself. The export's temporary folder is a name of its own: a user's
  // fresh1.tmp beside it is left as it was.
  std::filesystem::create_directory(dir / "fresh1.tmp");
  test::writeFile(dir / "fresh1.tmp/mine.txt", "mine");
  auto besideFresh1 = [&] {
    std::set<std::string> names;
    for (const auto& e : std::filesystem::directory_iterator(dir.path))
      if (std::string n = e.path().filename().string(); n.rfind("fresh1", 0) == 0) names.insert(n);
    return names;
  };
  auto fresh = tpcIn(dir, "export --hf fresh1/ ck");
  CHECK(fresh.exitCode == 0);
  CHECK(fresh.out.rfind("wrote fresh1/config.json and fresh1/model.safetensors", 0) == 0);
  CHECK(std::filesystem::exists(dir / "fresh1/model.safetensors"));
  CHECK(test::readFile(dir / "fresh1.tmp/mine.txt") == "mine");
  CHECK(besideFresh1() == std::set<std::string>{"fresh1", "fresh1.tmp"});  // no temporary folder left

  // import checks -o and its weights folder before it writes anything.
  std::filesystem::create_directory(dir / "dd.fb");
  fails("import --hf fresh1 -o dd.fb", "-o dd.fb: error: is a directory; name a file to write, not a folder");
  fails("import --hf fresh1 -o nowhere/x.fb", "-o nowhere/x.fb: error: the folder nowhere does not exist; create it first");
  fails("import --hf fresh1 -o ''", "tpc import: error: -o is empty; name the file to write");
  test::writeFile(dir / "f.fb.weights", "");
  fails("import --hf fresh1 -o f.fb",
        "f.fb.weights: error: exists and is not a folder; the weights of -o f.fb go there: remove it or name another -o");
  std::filesystem::create_directory(dir / "run.fb.weights");
  test::writeFile(dir / "run.fb.weights/latest_checkpointed_iteration.txt", "2\n");
  fails("import --hf fresh1 -o run.fb",
        "run.fb.weights: error: holds other checkpoints than an imported one; the weights of -o run.fb go there: remove it or name another -o");
  // An earlier import is replaced.
  for (int i = 0; i < 2; ++i)
    CHECK(tpcIn(dir, "import --hf fresh1 -o ok.fb").exitCode == 0);
  // -o naming a file the import reads would destroy it.
  fails("import --hf fresh1 -o fresh1/config.json",
        "-o fresh1/config.json: error: is the config.json that --hf reads; name another model file");

  // Exporting into an existing model folder replaces its two files and keeps the rest (a tokenizer, a README).
  test::writeFile(dir / "fresh1/tokenizer.json", "{\"mine\": 1}");
  const std::string oldConfig = test::readFile(dir / "fresh1/config.json");
  test::writeFile(dir / "fresh1/config.json", "{\"model_type\": \"gpt2\"}");
  REQUIRE(tpcIn(dir, "export --hf fresh1 ck").exitCode == 0);
  CHECK(test::readFile(dir / "fresh1/tokenizer.json") == "{\"mine\": 1}");
  CHECK(test::readFile(dir / "fresh1/config.json") == oldConfig);
  CHECK(besideFresh1() == std::set<std::string>{"fresh1", "fresh1.tmp"});
  std::filesystem::remove(dir / "fresh1/config.json");
  std::filesystem::create_directories(dir / "fresh1/config.json/x");
  fails("export --hf fresh1 ck",
        "fresh1/config.json: error: is a folder where the export writes a file; remove it or name another --hf");
  fails("import --hf fresh1 -o y.fb", "fresh1/config.json: error: is a folder, not the model's config file");
}

TEST_CASE("hf: a re-export replaces config.json and model.safetensors together or not at all", "[hf][cli]") {
  test::TempDir dir;
  std::string ck = trainedCheckpoint(dir);
  // The pair a re-export writes, and an old pair (another model's config and weights) in the folder it replaces.
  REQUIRE(tpc("export --hf " + (dir / "ref") + " " + ck).exitCode == 0);
  const std::string newConfig = test::readFile(dir / "ref/config.json");
  const std::string newWeights = test::readFile(dir / "ref/model.safetensors");
  const std::string oldConfig = "{\"model_type\": \"gpt2\"}", oldWeights = "old weights";
  auto oldPair = [&] {
    test::writeFile(dir / "hf/config.json", oldConfig);
    test::writeFile(dir / "hf/model.safetensors", oldWeights);
  };
  std::filesystem::create_directory(dir / "hf");
  oldPair();
  // A folder at config.json.tmp (debris, or a user's): an export that wrote the weights, then the config through
  // that name, failed between the two and left new weights beside the old config.
  std::filesystem::create_directories(dir / "hf/config.json.tmp/x");
  auto e = tpc("export --hf " + (dir / "hf") + " " + ck);
  std::string config = test::readFile(dir / "hf/config.json"), weights = test::readFile(dir / "hf/model.safetensors");
  CHECK(((config == newConfig && weights == newWeights) || (config == oldConfig && weights == oldWeights)));
  CHECK(e.exitCode == 0);
  CHECK(config == newConfig);
  CHECK(weights == newWeights);
  CHECK(namesIn(dir / "hf") == std::set<std::string>{"config.json", "config.json.tmp", "model.safetensors"});

  // Ctrl-C right after model.safetensors is in place (a test hook raises SIGINT there): the export ends of it once
  // config.json is in place too.
  oldPair();
  e = tpc("export --hf " + (dir / "hf") + " " + ck, "TPC_TEST_SIGINT_AFTER_RENAME=model.safetensors ");
  CHECK(e.exitCode == 128 + SIGINT);
  CHECK(test::readFile(dir / "hf/model.safetensors") == newWeights);
  CHECK(test::readFile(dir / "hf/config.json") == newConfig);
  CHECK(namesIn(dir / "hf") == std::set<std::string>{"config.json", "config.json.tmp", "model.safetensors"});
}

TEST_CASE("hf: a re-import replaces the model file and its weights together or not at all", "[hf][cli]") {
  test::TempDir dir;
  std::string ck = trainedCheckpoint(dir);
  REQUIRE(tpc("export --hf " + (dir / "hf") + " " + ck).exitCode == 0);
  // The model file and the copy of it in its weights are one pair; a re-import with another --lr changes both.
  REQUIRE(tpc("import --hf " + (dir / "hf") + " -o " + (dir / "m.fb")).exitCode == 0);
  const std::string firstModel = test::readFile(dir / "m.fb");
  REQUIRE(test::readFile(dir / "m.fb.weights/iter_0000000/model.fb") == firstModel);
  auto weightsOnly = [&] {
    CHECK(namesIn(dir / "m.fb.weights") == std::set<std::string>{"iter_0000000", "latest_checkpointed_iteration.txt"});
    CHECK(namesIn(dir / "m.fb.weights/iter_0000000") ==
          std::set<std::string>{"model.fb", "model.safetensors", "state.json"});
  };
  // A folder in the way of a model file written through m.fb.tmp: an import that replaced the weights first, then
  // failed there, left the new weights beside the old model file.
  std::filesystem::create_directories(dir / "m.fb.tmp/x");
  auto i = tpc("import --hf " + (dir / "hf") + " -o " + (dir / "m.fb") + " --lr 0.0005");
  const std::string model = test::readFile(dir / "m.fb");
  CHECK(model == test::readFile(dir / "m.fb.weights/iter_0000000/model.fb"));
  CHECK(i.exitCode == 0);
  CHECK(model != firstModel);
  weightsOnly();

  // Ctrl-C right after the weights' latest file is in place (a test hook raises SIGINT there): the import ends of
  // it once the model file is in place too.
  i = tpc("import --hf " + (dir / "hf") + " -o " + (dir / "m.fb") + " --lr 0.0007",
          "TPC_TEST_SIGINT_AFTER_RENAME=latest_checkpointed_iteration.txt ");
  CHECK(i.exitCode == 128 + SIGINT);
  CHECK(test::readFile(dir / "m.fb") == test::readFile(dir / "m.fb.weights/iter_0000000/model.fb"));
  CHECK(test::readFile(dir / "m.fb") != model);
  weightsOnly();
  // The imported pair loads and fine-tunes.
  CHECK(tpc("run " + (dir / "m.fb") + " --threads 2 --train-iters 1 --quiet --finetune --load " + (dir / "m.fb.weights"))
            .exitCode == 0);
}

TEST_CASE("sample: seeded, and greedy decoding picks the argmax of the dumped logits", "[sample][cli]") {
  test::TempDir dir;
  std::string ck = trainedCheckpoint(dir);
  std::string base = "sample --threads 2 --load " + ck + " --prompt 'The jury' ";
  auto a = tpc(base + "--max-tokens 6 --seed 5 --top-k 10");
  auto b = tpc(base + "--max-tokens 6 --seed 5 --top-k 10");
  REQUIRE(a.exitCode == 0);
  CHECK(a.out == b.out);
  CHECK(a.out.rfind("The jury", 0) == 0);
  CHECK(a.out.size() > std::string("The jury\n").size());
  auto g = tpc(base + "--temperature 0 --max-tokens 1 --dump-logits " + (dir / "l.safetensors"));
  REQUIRE(g.exitCode == 0);
  auto l = readSafetensors(dir / "l.safetensors");
  REQUIRE(l.ok());
  const HostTensor* logits = l->find("logits");
  REQUIRE(logits);
  CHECK(logits->type().str() == "f32[8,257]");  // "The jury": 8 bytes, byte tokenizer
  const float* last = logits->data<float>() + 7 * 257;
  int next = static_cast<int>(std::max_element(last, last + 257) - last);
  REQUIRE(next < 256);
  CHECK(g.out == "The jury" + std::string(1, static_cast<char>(next)) + "\n");
  auto bad = tpc("sample --load " + ck + " --temperature -1");
  CHECK(bad.exitCode == 1);
  CHECK(bad.err.find("--temperature must be a finite number >= 0") != std::string::npos);
  CHECK(tpc("sample --load " + ck + " --temperature nan").exitCode == 1);
  // The prompt is a flag: a bare word is refused, not dropped.
  auto bare = tpc("sample --load " + ck + " 'The jury'");
  CHECK(bare.exitCode == 1);
  CHECK(bare.err == "tpc sample: error: unexpected argument 'The jury' (the text to continue goes in --prompt)\n");
}

TEST_CASE("sample: --top-p is checked, and a top-p below the argmax's probability samples greedily", "[sample][cli]") {
  test::TempDir dir;
  std::string ck = trainedCheckpoint(dir);
  for (const char* bad : {"0", "-0.5", "1.5", "nan", "abc", "''"}) {
    auto r = tpc("sample --load " + ck + " --top-p " + bad);
    CHECK(r.exitCode == 1);
    CHECK(r.err == "tpc sample: error: --top-p must be a number in (0, 1] (1: off), got '" +
                       std::string(bad == std::string("''") ? "" : bad) + "'\n");
    CHECK(r.out.empty());
  }
  auto help = tpc("sample --help");
  CHECK(help.exitCode == 0);
  CHECK((help.out + help.err).find("--top-p") != std::string::npos);
  // Only the most likely token is left to draw from, whatever the seed: the greedy text.
  std::string base = "sample --threads 2 --load " + ck + " --prompt 'The jury' --max-tokens 6 ";
  auto greedy = tpc(base + "--temperature 0");
  REQUIRE(greedy.exitCode == 0);
  for (const char* seed : {"1", "2"}) {
    auto nucleus = tpc(base + "--temperature 1 --top-p 1e-6 --seed " + seed);
    CHECK(nucleus.exitCode == 0);
    CHECK(nucleus.out == greedy.out);
  }
  // 1 is off: the same draws as no --top-p.
  CHECK(tpc(base + "--seed 5 --top-p 1").out == tpc(base + "--seed 5").out);
}

TEST_CASE("sample: a prompt longer than the position table is cut to its end with a note", "[sample][cli]") {
  test::TempDir dir;
  std::string ck = trainedCheckpoint(dir);
  // tiny has 64 positions; 100 bytes of prompt are 100 tokens of the byte tokenizer.
  const std::string prompt(100, 'x');
  auto r = tpc("sample --threads 2 --temperature 0 --max-tokens 2 --load " + ck + " --prompt " + prompt +
               " --dump-logits " + (dir / "l.safetensors"));
  REQUIRE(r.exitCode == 0);
  CHECK(r.out.rfind(prompt, 0) == 0);  // the whole prompt is echoed
  CHECK(r.err.find("note: the prompt is 100 tokens, longer than the model's 64 positions; it continues from the last 64\n") ==
        0);
  auto l = readSafetensors(dir / "l.safetensors");
  REQUIRE(l.ok());
  CHECK(l->find("tokens")->type().str() == "i32[64]");
  // A prompt that fits gets no note.
  auto fits = tpc("sample --threads 2 --max-tokens 2 --load " + ck + " --prompt " + std::string(64, 'x'));
  CHECK(fits.exitCode == 0);
  CHECK(fits.err.empty());
}

TEST_CASE("sample: a prompt the GPT-2 tokenizer cannot read is refused naming --prompt", "[sample][cli]") {
  test::TempDir dir;
  REQUIRE(tpc("new gpt --preset gpt2 --layers 1 --hidden 64 --heads 2 --positions 16 --seq 16 --micro-batch-size 2 "
              "--global-batch-size 2 -o " + (dir / "g.fb")).exitCode == 0);
  REQUIRE(tpc("run " + (dir / "g.fb") + " --backend cpu --threads 2 --train-iters 1 --quiet --eval-interval 0 --save " +
              (dir / "ck")).exitCode == 0);
  auto r = tpc("sample --threads 2 --max-tokens 2 --load " + (dir / "ck") + " --prompt \"$(printf 'ab\\377')\"");
  CHECK(r.exitCode == 1);
  CHECK(r.err == "tpc sample: error: --prompt: the text is not valid UTF-8 (byte 2)\n");
  CHECK(r.out.empty());
}

namespace {
struct Fill {
  std::string tensor;
  int64_t from, count;
  float value;
};
// Writes `base` to the checkpoint file `st` with elements [from, from + count) of each named f32 tensor set to value.
void writeFilled(const std::string& st, SafetensorsFile base, const std::vector<Fill>& fills) {
  for (const Fill& fill : fills)
    for (auto& [n, t] : base.tensors)
      if (n == fill.tensor) {
        t = t.clone();
        std::fill(t.data<float>() + fill.from, t.data<float>() + fill.from + fill.count, fill.value);
      }
  REQUIRE(writeSafetensors(st, base).ok());
}
}  // namespace

TEST_CASE("sample: non-finite weights or logits stop sampling with one error, not a repeated token", "[sample][cli]") {
  test::TempDir dir;
  std::string ck = trainedCheckpoint(dir);
  const std::string st = ck + "/iter_0000002/model.safetensors";
  auto original = readSafetensors(st);
  REQUIRE(original.ok());
  auto withTensor = [&](const std::string& name, int64_t from, int64_t count, float value) {
    writeFilled(st, *original, {{name, from, count, value}});
  };
  for (const char* mode : {"--temperature 0", "--temperature 1"}) {
    withTensor("ln_f.weight", 3, 1, std::nanf(""));
    auto nan = tpc("sample --threads 2 --max-tokens 4 --load " + ck + " " + mode);
    CHECK(nan.exitCode == 1);
    CHECK(nan.err == ck + "/iter_0000002/model.safetensors: error: tensor ln_f.weight holds nan at element 3; a model with "
                          "non-finite weights cannot be sampled\n");
    CHECK(nan.out.empty());
    // Finite weights whose logits overflow: wte row 200 at the float maximum makes token 200's logit infinite.
    withTensor("wte", 200 * 128, 128, 3e38f);
    auto inf = tpc("sample --threads 2 --max-tokens 4 --load " + ck + " " + mode);
    CHECK(inf.exitCode == 1);
    CHECK(inf.err.rfind("tpc sample: error: the logit of token 200 is ", 0) == 0);
    CHECK(inf.err.find("(at generated token 1): the model's forward overflowed") != std::string::npos);
  }
}

// The audit of the thirty-ninth session: export and import passed NaN weights on without a word, while sample refused
// them; transformers (or a fine-tune) then computes NaN logits.
TEST_CASE("hf: export, import and run --load refuse non-finite weights by tensor and element, writing nothing", "[hf][cli]") {
  test::TempDir dir;
  std::string ck = trainedCheckpoint(dir);
  REQUIRE(tpc("export --hf " + (dir / "hf") + " " + ck).exitCode == 0);
  const std::string hfSt = dir / "hf/model.safetensors";
  auto hfOriginal = readSafetensors(hfSt);
  REQUIRE(hfOriginal.ok());
  writeFilled(hfSt, *hfOriginal, {{"transformer.h.1.mlp.c_fc.bias", 7, 1, -INFINITY}});
  auto imp = tpc("import --hf " + (dir / "hf") + " -o " + (dir / "m.fb"));
  CHECK(imp.exitCode == 1);
  CHECK(imp.err == hfSt + ": error: tensor transformer.h.1.mlp.c_fc.bias holds -inf at element 7; a model with "
                          "non-finite weights cannot be trained or sampled\n");
  CHECK_FALSE(std::filesystem::exists(dir / "m.fb"));
  CHECK_FALSE(std::filesystem::exists(dir / "m.fb.weights"));

  const std::string st = ck + "/iter_0000002/model.safetensors";
  auto original = readSafetensors(st);
  REQUIRE(original.ok());
  writeFilled(st, *original, {{"wpe", 5, 2, std::nanf("")}});
  auto exp = tpc("export --hf " + (dir / "hf2") + " " + ck);
  CHECK(exp.exitCode == 1);
  CHECK(exp.err == st + ": error: tensor wpe holds nan at element 5; a model with non-finite weights is not exported "
                        "(export an earlier iter_N folder of the checkpoint, from before the run diverged)\n");
  CHECK_FALSE(std::filesystem::exists(dir / "hf2"));
  // A resumed run: the NaN showed only steps later, as a divergence of the new run's.
  auto run = tpc("run " + test::binaryPath("models/tiny.fb") + " --threads 2 --train-iters 4 --load " + ck);
  CHECK(run.exitCode == 1);
  CHECK(run.err == st + ": error: tensor wpe holds nan at element 5; a checkpoint with non-finite values cannot be "
                        "trained on; load an earlier iter_N folder, from before the run diverged\n");
  CHECK(run.out.find("step ") == std::string::npos);
}

TEST_CASE("sample: --dump-logits is written only when sampling succeeds", "[sample][cli]") {
  test::TempDir dir;
  std::string ck = trainedCheckpoint(dir);
  const std::string st = ck + "/iter_0000002/model.safetensors";
  auto original = readSafetensors(st);
  REQUIRE(original.ok());
  const std::string base = "sample --threads 2 --load " + ck + " --prompt 'The jury' --max-tokens 3 --dump-logits ";
  auto good = tpc(base + (dir / "earlier.safetensors"));
  REQUIRE(good.exitCode == 0);
  const std::string earlier = test::readFile(dir / "earlier.safetensors");
  REQUIRE(!earlier.empty());
  // Overflowing logits (wte row 200 at the float maximum) fail the first generated token, after the prompt's
  // logits were computed: no new file, and an earlier one at the path left as it was.
  writeFilled(st, *original, {{"wte", 200 * 128, 128, 3e38f}});
  auto fresh = tpc(base + (dir / "fresh.safetensors"));
  CHECK(fresh.exitCode == 1);
  CHECK(fresh.err.find("the model's forward overflowed") != std::string::npos);
  CHECK(!std::filesystem::exists(dir / "fresh.safetensors"));
  auto over = tpc(base + (dir / "earlier.safetensors"));
  CHECK(over.exitCode == 1);
  CHECK(test::readFile(dir / "earlier.safetensors") == earlier);
  // Stopping at a generated end-of-document token is a success: the file is written (ln_f's gain 0 and bias 1
  // with wte row 256 at 10 make the end of document the argmax, as in the test below).
  writeFilled(st, *original, {{"ln_f.weight", 0, 128, 0.f}, {"ln_f.bias", 0, 128, 1.f}, {"wte", 256 * 128, 128, 10.f}});
  auto eod = tpc(base + (dir / "eod.safetensors") + " --temperature 0");
  CHECK(eod.exitCode == 0);
  CHECK(eod.err.find("stopped at the end-of-document token") == 0);
  auto l = readSafetensors(dir / "eod.safetensors");
  REQUIRE(l.ok());
  CHECK(l->find("logits")->type().str() == "f32[8,257]");
  // The generated text that cannot be written (a full disk) is an error, and no logits are written after it.
  auto full = tpc(base + (dir / "full.safetensors") + " > /dev/full");
  CHECK(full.exitCode == 1);
  CHECK(full.err == "tpc sample: error: cannot write the generated text to stdout (is the disk full?)\n");
  CHECK(!std::filesystem::exists(dir / "full.safetensors"));
  // No temporary file beside them either.
  int files = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir.path)) files += e.is_regular_file();
  CHECK(files == 2);
}

TEST_CASE("sample: a generated end-of-document token ends the text unless --ignore-eod", "[sample][cli]") {
  test::TempDir dir;
  std::string ck = trainedCheckpoint(dir);
  const std::string st = ck + "/iter_0000002/model.safetensors";
  auto f = readSafetensors(st);
  REQUIRE(f.ok());
  // ln_f's gain 0 and bias 1 make every position's final hidden state all ones, so token k's logit is the sum
  // of wte row k: row 256 (the byte tokenizer's end of document) at 10 per element is the argmax by far.
  writeFilled(st, *f, {{"ln_f.weight", 0, 128, 0.f}, {"ln_f.bias", 0, 128, 1.f}, {"wte", 256 * 128, 128, 10.f}});
  const std::string base = "sample --threads 2 --load " + ck + " --prompt 'The jury' --max-tokens 3 ";
  for (const char* mode : {"--temperature 0", "--temperature 1 --seed 9"}) {
    auto stop = tpc(base + mode);
    CHECK(stop.exitCode == 0);
    CHECK(stop.out == "The jury\n");
    CHECK(stop.err == "stopped at the end-of-document token after 0 generated tokens (--ignore-eod goes on past it)\n");
  }
  auto on = tpc(base + "--temperature 0 --ignore-eod");
  CHECK(on.exitCode == 0);
  CHECK(on.out == "The jury<|endoftext|><|endoftext|><|endoftext|>\n");
  CHECK(on.err.empty());
}

TEST_CASE("sample: a vocabulary larger than the tokenizer's draws only ids the tokenizer can decode", "[sample][cli]") {
  test::TempDir dir;
  // The byte tokenizer has 257 ids; rows 257-999 are trained (toward never) but no text maps to them.
  REQUIRE(tpc("new gpt --preset tiny --vocab 1000 -o " + (dir / "v.fb")).exitCode == 0);
  REQUIRE(tpc("run " + (dir / "v.fb") + " --threads 2 --train-iters 1 --quiet --eval-interval 0 --save " + (dir / "ck"))
              .exitCode == 0);
  for (const char* mode : {"--temperature 1", "--temperature 5 --top-k 900"}) {
    auto r = tpc("sample --threads 2 --load " + (dir / "ck") + " --prompt ab --max-tokens 40 --seed 3 " + mode);
    CHECK(r.exitCode == 0);
    CHECK(r.err.empty());
  }
}

TEST_CASE("sample: the fixed window (one graph) gives today's greedy output, also past the position table", "[sample][cli]") {
  test::TempDir dir;
  std::string ck = trainedCheckpoint(dir);
  std::string base = "sample --threads 2 --backend cpu --temperature 0 --load " + ck + " --prompt 'The jury' ";
  // 20 new tokens: a window of 28, the context at its front and padding after it for every token but the
  // last. 70: the context passes tiny's 64 positions, so the window slides over the last 64 tokens.
  for (const char* n : {"20", "70"}) {
    auto grow = tpc(base + "--window grow --max-tokens " + n);
    auto fixed = tpc(base + "--window fixed --max-tokens " + n);
    INFO("--max-tokens " << n << "\ngrow: " << grow.out << grow.err << "\nfixed: " << fixed.out << fixed.err);
    REQUIRE(grow.exitCode == 0);
    REQUIRE(fixed.exitCode == 0);
    CHECK(fixed.out == grow.out);
    CHECK(fixed.out.size() > std::string("The jury\n").size());
  }
  auto bad = tpc("sample --load " + ck + " --window slide");
  CHECK(bad.exitCode == 1);
  CHECK(bad.err == "tpc sample: error: --window=slide is not a window mode (expected fixed or grow)\n");
}

}  // namespace tpc
