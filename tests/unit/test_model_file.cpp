// Model files: .fb/.json round trips, one-line errors naming file and field, and a mutation fuzz test.
#include <catch2/catch.hpp>

#include <array>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>

#include "frontend/model_file.h"
#include "ir/parser.h"
#include "ir/printer.h"
#include "models/gpt.h"
#include "test_support.h"

namespace tpc {
namespace {

ModelFile tinyModel(double dropout = 0.0) {
  auto preset = gptPreset("tiny");
  REQUIRE(preset.ok());
  preset->gpt.hiddenDropout = dropout;
  preset->gpt.attentionDropout = dropout;
  auto m = buildGpt(preset->gpt, preset->config);
  REQUIRE(m.ok());
  return std::move(*m);
}

std::string bytesOf(const ModelFile& m, bool json) {
  auto s = serializeModel(m, json);
  REQUIRE(s.ok());
  return *s;
}

// Loads and expects one error line naming the file and containing every `parts`.
void expectError(const std::string& bytes, const std::string& file, std::initializer_list<std::string> parts) {
  auto r = loadModelFromBytes(bytes, file);
  REQUIRE_FALSE(r.ok());
  INFO(r.error());
  CHECK(r.error().find('\n') == std::string::npos);
  CHECK(r.error().rfind(file + ":", 0) == 0);
  CHECK(r.error().find("error: ") != std::string::npos);
  for (const std::string& p : parts) CHECK(r.error().find(p) != std::string::npos);
}

std::string replaceOnce(std::string s, const std::string& from, const std::string& to) {
  size_t at = s.find(from);
  REQUIRE(at != std::string::npos);
  return s.replace(at, from.size(), to);
}

void checkSame(const ModelFile& a, const ModelFile& b) {
  CHECK(printGraph(*a.forward) == printGraph(*b.forward));
  CHECK(a.config == b.config);
  CHECK(a.lossOutput == b.lossOutput);
  REQUIRE(a.gpt.has_value() == b.gpt.has_value());
  if (a.gpt) CHECK(*a.gpt == *b.gpt);
}

}  // namespace

TEST_CASE("model file: .fb and .json round trips keep the graph and config", "[model_file]") {
  for (double dropout : {0.0, 0.1}) {
    ModelFile m = tinyModel(dropout);
    m.config.dataPath = "data/with \"quotes\" and \\ and \t tab";
    m.config.seed = 18446744073709551615ull;
    m.config.lr = 0.1 + 0.2;  // not exactly representable in 12 digits
    m.config.distributedOptimizer = dropout > 0;  // use_distributed_optimizer, both values
    for (bool json : {false, true}) {
      std::string file = json ? "gpt.json" : "gpt.fb";
      auto back = loadModelFromBytes(bytesOf(m, json), file);
      REQUIRE(back.ok());
      checkSame(m, *back);
      // And the reloaded model writes the same bytes again.
      CHECK(bytesOf(*back, json) == bytesOf(m, json));
    }
  }
}

// model.fbs spells the IR's `bool` as `boolean`: the loader read such a tensor as f32 (the name lookup failed and an
// empty optional was used) and the writer aborted on it.
TEST_CASE("model file: a bool tensor round trips in both formats", "[model_file]") {
  auto g = parseGraph(R"(graph @g(%x: f32[4]) params(%w: f32[4]) {
  %b = cast(%x) {to=bool} : bool[4]
  %f = cast(%b) {to=f32} : f32[4]
  %y = mul(%f, %w) : f32[4]
  %l = reduce_sum(%y) {axes=[0]} : f32[]
  return %l
})");
  REQUIRE(g.ok());
  ModelFile m;
  m.forward = std::move(*g);
  m.lossOutput = "l";
  for (bool json : {false, true}) {
    std::string file = json ? "b.json" : "b.fb";
    auto back = loadModelFromBytes(bytesOf(m, json), file);
    INFO(file << ": " << (back.ok() ? std::string() : back.error()));
    REQUIRE(back.ok());
    CHECK_THAT(printGraph(*back->forward), Catch::Contains("cast(%x) {to=bool} : bool[4]"));
    checkSame(m, *back);
  }
}

// The audit of the thirty-ninth session: `tpc new --data-path` with bytes that are not UTF-8 wrote a .json that tpc then
// refused to read ("illegal UTF-8 sequence"). .fb holds any bytes; .json is refused before anything is written.
TEST_CASE("model file: a string that is not UTF-8 saves as .fb and is refused as .json", "[model_file]") {
  ModelFile m = tinyModel();
  m.config.dataPath = "data/\xff\xfe" "abc";
  auto back = loadModelFromBytes(bytesOf(m, false), "u.fb");
  REQUIRE(back.ok());
  CHECK(back->config.dataPath == m.config.dataPath);
  test::TempDir dir;
  const std::string path = dir / "u.json";
  Status s = saveModelFile(m, path);
  REQUIRE_FALSE(s.ok());
  CHECK(s.error() == path + ": error: the field data_path (byte 5 of 'data/??abc') is not UTF-8, which a .json model "
                            "file cannot hold; write a .fb model file instead, or give the value in UTF-8");
  CHECK_FALSE(std::filesystem::exists(path));
  m.config.dataPath = "data/caf\xc3\xa9";  // UTF-8 is kept as it is
  auto json = loadModelFromBytes(bytesOf(m, true), "u.json");
  REQUIRE(json.ok());
  CHECK(json->config.dataPath == m.config.dataPath);
}

TEST_CASE("model file: save writes atomically and loads by extension", "[model_file]") {
  ModelFile m = tinyModel();
  std::string dir = test::binaryPath("tests");
  for (const char* name : {"/rt_model.fb", "/rt_model.json"}) {
    std::string path = dir + name;
    REQUIRE(saveModelFile(m, path).ok());
    CHECK(test::readFile(path + ".tmp").empty());
    auto back = loadModelFile(path);
    REQUIRE(back.ok());
    checkSame(m, *back);
  }
  auto bad = saveModelFile(m, dir + "/x.txt");
  CHECK_FALSE(bad.ok());
  auto missing = loadModelFile(dir + "/does_not_exist.fb");
  REQUIRE_FALSE(missing.ok());
  CHECK(missing.error().find("does_not_exist.fb: error: cannot open") != std::string::npos);
}

TEST_CASE("model file: schema defaults equal TrainConfig's and GptConfig's", "[model_file]") {
  auto p = parsePresetJson(R"({"arch_type": "GptArch", "arch": {"layers": 12, "hidden": 768, "heads": 12, "vocab": 50257}})",
                           "p.json");
  REQUIRE(p.ok());
  CHECK(p->config == TrainConfig{});
  CHECK(p->gpt == GptConfig{});
}

TEST_CASE("model file: bad files give one line naming file and field", "[model_file]") {
  ModelFile m = tinyModel();
  std::string fb = bytesOf(m, false), json = bytesOf(m, true);

  SECTION("truncated .fb") { expectError(fb.substr(0, fb.size() / 2), "gpt.fb", {"corrupt or truncated"}); }
  SECTION("random bytes") {
    std::mt19937 rng(7);
    std::string junk(4096, '\0');
    for (char& c : junk) c = static_cast<char>(rng());
    expectError(junk, "gpt.fb", {"not a tpc model file (bad identifier"});
    expectError("", "gpt.fb", {"not a tpc model file"});
  }
  SECTION("bad identifier") { expectError(replaceOnce(fb, "TPCM", "TPCX"), "gpt.fb", {"bad identifier"}); }
  SECTION("unknown extension") { expectError(fb, "gpt.bin", {"unknown model file extension"}); }
  SECTION("not JSON") { expectError("graph @g() {}", "gpt.json", {"gpt.json:1:"}); }
  SECTION("unknown JSON field") {
    expectError(replaceOnce(json, "\"producer\"", "\"bogus\": 1, \"producer\""), "gpt.json", {"unknown field", "bogus"});
    expectError(replaceOnce(json, "\"micro_batch_size\"", "\"micro_batch\": 4, \"micro_batch_size\""), "gpt.json",
                {"micro_batch"});
    // The closest field name of the table being parsed, where one is close (arch is a union: its GptArch).
    expectError(replaceOnce(json, "\"seq_length\"", "\"seq_lenght\""), "gpt.json",
                {"unknown field: seq_lenght (did you mean \"seq_length\"?)"});
    expectError(replaceOnce(json, "\"heads\": 4", "\"head\": 4"), "gpt.json", {"unknown field: head (did you mean \"heads\"?)"});
    // Not a field of another table: "heads" is arch's, not config's; and no hint where nothing is close.
    for (const char* bad : {"\"head\": 4, \"seq_length\"", "\"zzzzzzzz\": 4, \"seq_length\""}) {
      auto r = loadModelFromBytes(replaceOnce(json, "\"seq_length\"", bad), "gpt.json");
      REQUIRE_FALSE(r.ok());
      CHECK(r.error().find("did you mean") == std::string::npos);
      CHECK(r.error().substr(r.error().size() - 6) != ")");
    }
  }
  SECTION("unknown enum value: the values the field takes") {
    expectError(replaceOnce(json, "\"kind\": \"input\"", "\"kind\": \"inputs\""), "gpt.json",
                {"unknown enum value: inputs (kind is one of: value, input, param)"});
    expectError(replaceOnce(json, "\"dtype\": \"f32\"", "\"dtype\": \"fp32\""), "gpt.json",
                {"unknown enum value: fp32 (dtype is one of: f32, f64, f16, bf16, i32, i64, boolean)"});
  }
  SECTION("unknown op") { expectError(replaceOnce(json, "\"op\": \"gelu\"", "\"op\": \"gelux\""), "gpt.json", {"graph.nodes[", "unknown op 'gelux'"}); }
  SECTION("unsupported version") {
    expectError(replaceOnce(json, "\"format_version\": 1", "\"format_version\": 7"), "gpt.json", {"format_version 7"});
  }
  SECTION("shapes disagree") {
    ModelFile bad = tinyModel();
    for (Value* p : bad.forward->params())
      if (p->name() == "h.0.attn.c_attn.weight") p->setType(TensorType(DType::f32, {100, 384}));
    for (bool asJson : {false, true})
      expectError(bytesOf(bad, asJson), asJson ? "gpt.json" : "gpt.fb", {"graph.nodes[", "(matmul): matmul: contraction dims differ"});
  }
  SECTION("declared result type differs from the inferred one") {
    expectError(replaceOnce(json, "\"dtype\": \"f32\", \"shape\": [8, 64, 512]", "\"dtype\": \"f32\", \"shape\": [8, 64, 511]"),
                "gpt.json", {"(matmul): result 0", "declared f32[8,64,511] but matmul gives f32[8,64,512]"});
  }
  SECTION("operand index out of range or used before definition") {
    expectError(replaceOnce(json, "\"operands\": [2, 0]", "\"operands\": [2, 9999]"), "gpt.json", {"operands[1]=9999 is not a tensor index"});
  }
  SECTION("heads that do not divide hidden") {
    expectError(replaceOnce(json, "\"heads\": 4", "\"heads\": 5"), "gpt.json", {"arch.heads=5 must divide arch.hidden=128"});
  }
  SECTION("seq longer than the position table") {
    expectError(replaceOnce(json, "\"positions\": 64", "\"positions\": 32"), "gpt.json",
                {"config.seq_length=64 is longer than the position table arch.positions=32"});
  }
  SECTION("zero or negative sizes") {
    expectError(replaceOnce(json, "\"micro_batch_size\": 8", "\"micro_batch_size\": 0"), "gpt.json",
                {"config.micro_batch_size must be > 0, got 0"});
    expectError(replaceOnce(json, "\"layers\": 2", "\"layers\": -1"), "gpt.json", {"arch.layers must be > 0, got -1"});
    expectError(replaceOnce(json, "\"shape\": [8, 64]", "\"shape\": [8, -64]"), "gpt.json", {"graph.tensors[0] 'tokens'.shape"});
  }
  SECTION("a union without its type field: which field, and the types it names") {
    // It was flatbuffers' own "expecting: , instead got: }".
    expectError(replaceOnce(json, "\"arch_type\": \"GptArch\",", ""), "gpt.json",
                {"gpt.json:", ": error: \"arch\" needs \"arch_type\" beside it, naming its type (one of: GptArch)"});
    expectError(replaceOnce(json, "\"value_type\": \"FloatAttr\", ", ""), "gpt.json",
                {"\"value\" needs \"value_type\" beside it, naming its type (one of: IntAttr, FloatAttr, BoolAttr, "
                 "StringAttr, IntsAttr, DTypeAttr)"});
  }
  SECTION("no config table") {
    // Every field's default would be taken, seq_length 1024 among them, and blamed on the position table.
    const size_t from = json.find("\"config\": {"), to = json.find("},", from);
    REQUIRE(to != std::string::npos);
    const std::string noConfig = json.substr(0, from) + json.substr(json.find('"', to));
    expectError(noConfig, "gpt.json", {"gpt.json: error: config is missing"});
    auto defaults = loadModelFromBytes(noConfig.substr(0, from) + "\"config\": {}, " + noConfig.substr(from), "gpt.json");
    REQUIRE_FALSE(defaults.ok());
    CHECK(defaults.error().find("config.seq_length=1024 is longer than the position table") != std::string::npos);
  }
  SECTION("loss that is not an output") { expectError(replaceOnce(json, "\"loss\": \"loss\"", "\"loss\": \"nope\""), "gpt.json", {"loss 'nope'"}); }
  SECTION("bad config strings") {
    expectError(replaceOnce(json, "\"tokenizer_type\": \"byte\"", "\"tokenizer_type\": \"bpe\""), "gpt.json", {"config.tokenizer_type"});
    expectError(replaceOnce(json, "\"split\": \"949,50,1\"", "\"split\": \"949,50,1,1\""), "gpt.json",
                {"config.split='949,50,1,1' has 4 parts; at most three"});
    expectError(replaceOnce(json, "\"split\": \"949,50,1\"", "\"split\": \"1e400,1,1\""), "gpt.json",
                {"config.split='1e400,1,1' '1e400' is not a non-negative number"});
    expectError(replaceOnce(json, "\"split\": \"949,50,1\"", "\"split\": \"0,0\""), "gpt.json",
                {"config.split='0,0' its parts add up to 0"});
  }
}

TEST_CASE("model file: mutated .fb files give an error or a valid model, never a crash", "[model_file][fuzz]") {
  std::string fb = bytesOf(tinyModel(0.1), false);
  std::mt19937_64 rng(12345);
  int errors = 0, valid = 0;
  for (int iter = 0; iter < 600; ++iter) {
    std::string b = fb;
    int kind = iter % 4;
    int edits = 1 + static_cast<int>(rng() % 4);
    for (int e = 0; e < edits; ++e) {
      size_t at = rng() % b.size();
      if (kind == 0) b[at] = static_cast<char>(b[at] ^ (1 << (rng() % 8)));          // bit flip
      else if (kind == 1) b[at] = static_cast<char>(rng());                           // random byte
      else if (kind == 2) b.resize(std::max<size_t>(1, at));                          // truncation
      else for (size_t k = 0; k < 4 && at + k < b.size(); ++k) b[at + k] = static_cast<char>(rng());  // random word
    }
    auto r = loadModelFromBytes(b, "fuzz.fb");
    if (r.ok()) {
      ++valid;
      CHECK(!printGraph(*r->forward).empty());
    } else {
      ++errors;
      CHECK(r.error().find('\n') == std::string::npos);
      CHECK(r.error().rfind("fuzz.fb: error: ", 0) == 0);
    }
  }
  CHECK(errors > 0);
  UNSCOPED_INFO("fuzz: " << errors << " errors, " << valid << " valid");
  // JSON text mutations go through flatbuffers' parser and then the same checks.
  std::string json = bytesOf(tinyModel(), true);
  for (int iter = 0; iter < 200; ++iter) {
    std::string j = json;
    j[rng() % j.size()] = "0123456789-{}[]\",:ae \x01"[rng() % 23];
    auto r = loadModelFromBytes(j, "fuzz.json");
    if (!r.ok()) {
      INFO(r.error());
      CHECK(r.error().find('\n') == std::string::npos);
    }
  }
}

TEST_CASE("model file: a [long] vector that is not 8-aligned is refused", "[model_file][fuzz]") {
  // Found by fuzz/fuzz_model_fb: flatbuffers 2.0's verifier passes a shape vector at a 4-aligned address.
  std::string b = test::readFile(test::sourcePath("fuzz/corpus/fuzz_model_fb/misaligned_shape_vector.fb"));
  REQUIRE(!b.empty());
  expectError(b, "m.fb", {".shape is misaligned"});
}

TEST_CASE("model file: arch_type set with arch absent is refused", "[model_file][fuzz]") {
  // Found by fuzz/fuzz_model_fb: the verifier passes a union whose type is GptArch and whose table is absent.
  std::string b = bytesOf(tinyModel(), false);
  auto u32 = [&](size_t at) { uint32_t v; std::memcpy(&v, b.data() + at, 4); return v; };
  size_t table = u32(0);
  size_t vtable = table - static_cast<int32_t>(u32(table));
  uint16_t vtableBytes, archEntry;
  std::memcpy(&vtableBytes, b.data() + vtable, 2);
  const size_t archSlot = vtable + 4 + 2 * 6;  // Model's 7th field (format_version, producer, graph, loss, config, arch_type, arch)
  REQUIRE(archSlot + 2 <= vtable + vtableBytes);
  std::memcpy(&archEntry, b.data() + archSlot, 2);
  REQUIRE(archEntry != 0);  // the tiny model has its arch
  REQUIRE(loadModelFromBytes(b, "m.fb").ok());
  std::memset(b.data() + archSlot, 0, 2);
  expectError(b, "m.fb", {"arch_type is GptArch but arch is missing"});
}

TEST_CASE("tpc new and tpc dump", "[model_file][cli]") {
  std::string tpc = test::tpcBinary(), dir = test::binaryPath("tests");
  auto made = test::runCommand(tpc + " new gpt --preset tiny --layers 1 -o " + dir + "/cli_tiny.json");
  REQUIRE(made.exitCode == 0);
  auto dump = test::runCommand(tpc + " dump " + dir + "/cli_tiny.json");
  CHECK(dump.exitCode == 0);
  CHECK(dump.out.find("graph @gpt(%tokens: i32[8,64], %targets: i32[8,64])") == 0);
  CHECK(dump.out.find("h.1.") == std::string::npos);

  auto bad = test::runCommand(tpc + " new gpt --preset tiny --heads 5 -o " + dir + "/cli_bad.fb");
  CHECK(bad.exitCode == 1);
  CHECK(bad.err == "tpc new: error: --heads=5 must divide arch.hidden=128\n");
  CHECK(test::readFile(dir + "/cli_bad.fb").empty());
  auto badPreset = test::runCommand(tpc + " new gpt --preset huge -o " + dir + "/cli_bad.fb");
  CHECK(badPreset.exitCode == 1);
  CHECK(badPreset.err.find("unknown preset 'huge' (known: tiny, gpt2, gpt2-medium, gpt2-large, gpt2-xl, gpt-6.7b)") != std::string::npos);

  // One line naming the flag, and no file written.
  for (auto [args, expected] : std::vector<std::pair<std::string, std::string>>{
           {"--vocab 1", "tpc new: error: --vocab 1 is smaller than the byte tokenizer's 257 tokens (preset tiny); give --vocab 257 or more\n"},
           {"--preset gpt2 --vocab 50000",
            "tpc new: error: --vocab 50000 is smaller than the gpt2 tokenizer's 50257 tokens (preset gpt2); give --vocab 50257 or more\n"},
           {"--layers 99999999999999999999", "tpc new: error: --layers=99999999999999999999 is out of range [1, 1099511627776]\n"},
           {"--layers 2x", "tpc new: error: --layers=2x is not an integer\n"},
           // A value forgotten before -o: -o is the next flag, not the preset (which then blamed the file name).
           {"--preset", "tpc new: error: option --preset needs a value, but the next argument is the option '-o' (write "
                        "--preset=VALUE for a value that starts with -)\n"},
           // A negative number is a value, not a flag; the error names the flag, not the model file's config.lr.
           {"--lr -1", "tpc new: error: --lr must be > 0.0, got -1.0\n"},
           {"--micro-batch-size 3 --global-batch-size 8",
            "tpc new: error: --global-batch-size=8 must be a multiple of --micro-batch-size=3 (a step is whole micro "
            "batches on every data-parallel rank), e.g. 6 or 9\n"},
           // tpc new's own flags, named as given; a field from the preset keeps the model file's name.
           {"--seq 100", "tpc new: error: --seq=100 is longer than the position table arch.positions=64\n"},
           {"--positions 32", "tpc new: error: config.seq_length=64 is longer than the position table --positions=32\n"},
           {"--seq 100 --positions 50", "tpc new: error: --seq=100 is longer than the position table --positions=50\n"},
           {"--hidden 100 --heads 8", "tpc new: error: --heads=8 must divide --hidden=100\n"},
           {"--layers 5000", "tpc new: error: --layers=5000 is larger than the supported 4096\n"},
           {"--padded-vocab 200", "tpc new: error: --padded-vocab=200 must be >= arch.vocab=257\n"},
           {"--vocab 300 --padded-vocab 299", "tpc new: error: --padded-vocab=299 must be >= --vocab=300\n"},
           {"--hidden-dropout 1", "tpc new: error: --hidden-dropout must be in [0, 1), got 1.0\n"},
           {"--attention-dropout -0.5", "tpc new: error: --attention-dropout must be in [0, 1), got -0.5\n"}}) {
    auto r = test::runCommand(tpc + " new gpt " + args + " -o " + dir + "/cli_bad.fb");
    CHECK(r.exitCode == 1);
    CHECK(r.err == expected);
    CHECK(!std::filesystem::exists(dir + "/cli_bad.fb"));
  }
  auto noValue = test::runCommand(tpc + " new gpt -o");
  CHECK(noValue.exitCode == 1);
  CHECK(noValue.err == "tpc new: error: option -o needs a value\n");
  auto extra = test::runCommand(tpc + " new gpt -o " + dir + "/cli_bad.fb extra");
  CHECK(extra.exitCode == 1);
  CHECK(extra.err == "tpc new: error: unexpected argument 'extra' (tpc new gpt --preset tiny -o gpt.fb)\n");
  CHECK(!std::filesystem::exists(dir + "/cli_bad.fb"));
  auto toFolder = test::runCommand(tpc + " new gpt -o " + dir);
  CHECK(toFolder.exitCode == 1);
  CHECK(toFolder.err == "-o " + dir + ": error: is a directory; name a file to write, not a folder\n");
  // --vocab alone pads the new vocabulary (to 50304 rows), not the preset's 257 (384 rows).
  auto vocab = test::runCommand(tpc + " new gpt --vocab 50257 -o " + dir + "/cli_vocab.json");
  CHECK(vocab.exitCode == 0);
  CHECK(vocab.err.empty());
  auto vocabDump = test::runCommand(tpc + " dump " + dir + "/cli_vocab.json");
  CHECK(vocabDump.out.find("f32[50304,128]") != std::string::npos);

  auto after = test::runCommand(tpc + " dump " + dir + "/cli_tiny.json --after=autodiff");
  CHECK(after.exitCode == 0);
  CHECK(after.out.find("adamw_update(") != std::string::npos);
  CHECK(after.out.find("return %loss, %grad_norm, wte=") != std::string::npos);
  auto notInPipeline = test::runCommand(tpc + " dump " + dir + "/cli_tiny.json --after=fold-scales");
  CHECK(notInPipeline.exitCode == 1);
  CHECK(notInPipeline.err == "tpc dump: error: --after=fold-scales: not a pass of the pipeline (autodiff, cse, dce, fold-vocab-padding, fuse-classifier, fuse)\n");
  auto dce = test::runCommand(tpc + " dump " + dir + "/cli_tiny.json --after=dce");
  CHECK(dce.exitCode == 0);
  CHECK(dce.out.find("return %loss") != std::string::npos);
  // --passes and --summary mean the pipeline's output; an unknown pass is an error, printed pipeline or not.
  auto passes = test::runCommand(tpc + " dump " + dir + "/cli_tiny.json --passes=autodiff,dce");
  CHECK(passes.exitCode == 0);
  CHECK(passes.out.find("adamw_update(") != std::string::npos);  // the training step, not the forward graph
  for (const char* extra : {"", " --print-pipeline"}) {
    auto bogus = test::runCommand(tpc + " dump " + dir + "/cli_tiny.json --passes=bogus" + extra);
    CHECK(bogus.exitCode == 1);
    CHECK(bogus.err.find("unknown pass 'bogus'") != std::string::npos);
    CHECK(bogus.out.empty());
  }
  auto summary = test::runCommand(tpc + " dump " + dir + "/cli_tiny.json --tp 2 --summary");
  CHECK(summary.exitCode == 0);
  CHECK(summary.out.rfind("collectives per step (mesh(tp=2)):", 0) == 0);

  // A graph that its arch block does not describe is refused, whatever flags would rebuild it from arch.
  std::string text = test::readFile(dir + "/cli_tiny.json");
  for (auto [from, to, expected] : std::vector<std::array<std::string, 3>>{
           {"\"heads\": 4", "\"heads\": 8", "other heads than arch.heads"},
           {"\"layers\": 1", "\"layers\": 3", "h.1.ln_1.weight in arch's model"},
           // The rest of the graph too: a run at another tp or batch would rebuild it from arch and train arch's model.
           {"\"hidden_dropout\": 0.0", "\"hidden_dropout\": 0.1", "where arch builds '%2 = dropout(%1) {p=0.1, key=1}"},
           {"\"layer_norm_eps\": 1e-05", "\"layer_norm_eps\": 0.1", "{eps=1e-05} : f32[8,64,128]' where arch builds "},
           {"\"init_std\": 0.02", "\"init_std\": 0.5", "init=normal(0.02),' where arch builds 'params(%wte: f32[384,128] "
                                                          "init=normal(0.5),'"}}) {
    std::string edited = text;
    REQUIRE(edited.find(from) != std::string::npos);
    edited.replace(edited.find(from), from.size(), to);
    { std::ofstream(dir + "/cli_edited.json") << edited; }
    for (const char* flags : {"", " --seq-length 32"}) {
      auto r = test::runCommand(tpc + " run " + dir + "/cli_edited.json --backend cpu --train-iters 1" + flags);
      INFO(to << flags << ": " << r.err);
      CHECK(r.exitCode == 1);
      CHECK(r.err.find("the graph does not match the file's arch block") != std::string::npos);
      CHECK(r.err.find(expected) != std::string::npos);
    }
  }

  // A tp 4 run pads wte to a multiple of 128 x 4 rows, and its checkpoint keeps that graph beside the arch it came
  // from: the pair still loads.
  test::TempDir ck;
  REQUIRE(test::runTiny("--train-iters 1 --eval-interval 0 --tp 4 --quiet --save " + ck.path.string()).exitCode == 0);
  auto padded = test::runCommand(tpc + " dump " + ck.path.string() + "/iter_0000001/model.fb");
  INFO(padded.err);
  CHECK(padded.exitCode == 0);
  CHECK(padded.out.find("%wte: f32[128,128] init=normal(0.02) place=[tp:S(0)]") != std::string::npos);  // 512 rows / 4

  std::string junk = dir + "/cli_junk.fb";
  { std::ofstream(junk) << "hello"; }
  auto junkDump = test::runCommand(tpc + " dump " + junk);
  CHECK(junkDump.exitCode == 1);
  CHECK(junkDump.err == junk + ": error: not a tpc model file (bad identifier; expected \"TPCM\")\n");
}

TEST_CASE("the build writes a model file per preset", "[model_file][presets]") {
  for (const std::string& p : gptPresetNames()) {
    auto m = loadModelFile(test::binaryPath("models/" + p + ".fb"));
    REQUIRE(m.ok());
    REQUIRE(m->gpt.has_value());
    auto preset = gptPreset(p);
    REQUIRE(preset.ok());
    CHECK(m->config == preset->config);
  }
}

}  // namespace tpc
