// Passes: the pipeline parser, the registry, the pass manager (verifier between passes), cse/dce on
// graphs built in code, and loading the example plugin into this process (tpc_tests exports its symbols).
#include <stdlib.h>

#include <filesystem>

#include <catch2/catch.hpp>

#include "ir/graph.h"
#include "ir/parser.h"
#include "ir/printer.h"
#include "passes/builtin_passes.h"
#include "passes/pipeline.h"
#include "passes/plugin.h"
#include "test_support.h"

using namespace tpc;

namespace {

const std::string kExamplePlugin = std::string(TPC_TEST_PLUGIN_DIR) + "/libtpc_fold_scales.so";
const std::string kApi999Plugin = std::string(TPC_TEST_BAD_PLUGIN_DIR) + "/libtpc_fold_scales_api999.so";
const std::string kNotAPlugin = std::string(TPC_TEST_BAD_PLUGIN_DIR) + "/libtpc_not_a_plugin.so";
const std::string kThrowingPlugin = std::string(TPC_TEST_BAD_PLUGIN_DIR) + "/libtpc_throwing_plugin.so";

std::unique_ptr<Graph> parse(const std::string& text) {
  auto g = parseGraph(text, "test.tir");
  if (!g) FAIL(g.error());
  return std::move(g).value();
}

Result<bool> runPass(const PassRegistry& r, const std::string& name, Graph& g, PassOptions o = {}) {
  const PassInfo* info = r.find(name);
  if (!info) return makeError("no pass ", name);
  TPC_ASSIGN(auto pass, info->factory(o));
  return pass->run(g);
}

// A pass that breaks the graph (declares a wrong type), to see the pass manager's verifier catch it.
class CorruptingPass final : public Pass {
 public:
  std::string_view name() const override { return "corrupt"; }
  Result<bool> run(Graph& g) override {
    (*g.nodes().begin())->result()->setType(TensorType(DType::f32, {99}));
    return true;
  }
};

}  // namespace

TEST_CASE("the pipeline parser reads names and options", "[passes][pipeline]") {
  auto p = parsePipeline("a,b(k=v, k2=v2)", "--passes");
  REQUIRE(p.ok());
  REQUIRE(p->size() == 2);
  CHECK((*p)[0].name == "a");
  CHECK((*p)[0].column == 1);
  CHECK((*p)[0].options.values().empty());
  CHECK((*p)[1].name == "b");
  CHECK((*p)[1].column == 3);
  CHECK((*p)[1].options.values() == std::map<std::string, std::string>{{"k", "v"}, {"k2", "v2"}});

  auto spaced = parsePipeline("  cse , megatron-tp( tp = 4 ) ,dce ", "--passes");
  REQUIRE(spaced.ok());
  REQUIRE(spaced->size() == 3);
  CHECK((*spaced)[1].name == "megatron-tp");
  CHECK((*spaced)[1].column == 9);
  CHECK((*spaced)[1].options.getString("tp", "") == "4");
  CHECK((*spaced)[2].name == "dce");
  CHECK(parsePipeline("p()", "--passes").ok());
}

TEST_CASE("the pipeline parser rejects bad strings with the column", "[passes][pipeline]") {
  struct Case {
    const char* text;
    const char* error;
  };
  const Case cases[] = {
      {"", "--passes:1:1: error: the pipeline is empty (example: --passes=cse,dce)"},
      {"   ", "--passes:1:1: error: the pipeline is empty (example: --passes=cse,dce)"},
      {"cse,", "--passes:1:5: error: expected a pass name at the end of the pipeline"},
      {"cse,,dce", "--passes:1:5: error: expected a pass name, got ','"},
      {"cse dce", "--passes:1:5: error: expected ',' between passes, got 'd'"},
      {"cse(", "--passes:1:5: error: unclosed '(' in the options of pass 'cse'"},
      {"cse(a=1", "--passes:1:8: error: unclosed '(' in the options of pass 'cse'"},
      {"cse)", "--passes:1:4: error: expected ',' between passes, got ')'"},
      {"cse(=1)", "--passes:1:5: error: expected an option name in 'cse(...)'"},
      {"cse(a)", "--passes:1:6: error: expected '=' after option 'a'"},
      {"cse(a=)", "--passes:1:7: error: option 'a' of pass 'cse' has no value"},
      {"cse(a=1,a=2)", "--passes:1:9: error: option 'a' is given twice"},
      {"cse(a=1 b=2)", "--passes:1:9: error: expected ',' or ')' in the options of pass 'cse'"},
  };
  for (const Case& c : cases) {
    INFO("pipeline: '" << c.text << "'");
    auto p = parsePipeline(c.text, "--passes");
    REQUIRE_FALSE(p.ok());
    CHECK(p.error() == c.error);
  }
}

TEST_CASE("the pass manager refuses unknown passes and options", "[passes][pipeline]") {
  PassManager pm;
  Status unknown = pm.addPipeline("cse,nope", "--passes");
  REQUIRE_FALSE(unknown.ok());
  CHECK(unknown.error().rfind("--passes:1:5: error: unknown pass 'nope' (known: ", 0) == 0);
  PassManager pm2;
  Status option = pm2.addPipeline("dce(x=1)", "--passes");
  REQUIRE_FALSE(option.ok());
  CHECK(option.error() == "--passes:1:1: error: pass 'dce' has no option 'x' (it takes none)");
  PassManager pm3;
  REQUIRE(pm3.addPipeline("cse,dce,cse", "--passes").ok());
  CHECK(pm3.size() == 3);
}

TEST_CASE("a pipeline's errors are placed in the source it came from, and tpc's own have no place", "[passes][pipeline]") {
  // Another flag or file that holds a pipeline names itself.
  PassManager other;
  Status placed = other.addPipeline("cse,nope", "pipeline.txt");
  REQUIRE_FALSE(placed.ok());
  CHECK(placed.error().rfind("pipeline.txt:1:5: error: unknown pass 'nope' (known: ", 0) == 0);
  // tpc's own pipeline (tpc run's, the standard one of tpc dump): no text the user gave, so no place in one.
  PassManager own;
  Status unknown = own.addPipeline("cse,nope", "");
  REQUIRE_FALSE(unknown.ok());
  CHECK(unknown.error().rfind("unknown pass 'nope' (known: ", 0) == 0);
  CHECK(unknown.error().find("--passes") == std::string::npos);
  PassManager own2;
  Status option = own2.addPipeline("dce(x=1)", "");
  REQUIRE_FALSE(option.ok());
  CHECK(option.error() == "pass 'dce' has no option 'x' (it takes none)");
  // Its text does not parse only when a plugin's pass has a name no pipeline can spell: the text says where.
  auto parsed = parsePipeline("my tp(tp=2),dce", "");
  REQUIRE_FALSE(parsed.ok());
  CHECK(parsed.error() == "expected ',' between passes, got 't' (column 4 of the pipeline 'my tp(tp=2),dce')");
  // Entries keep their source, so a prefix added later (tpc dump --after) is placed as the whole text was.
  auto entries = parsePipeline("cse,nope", "--passes");
  REQUIRE(entries.ok());
  PassManager prefix;
  Status later = prefix.addEntries(*entries);
  REQUIRE_FALSE(later.ok());
  CHECK(later.error().rfind("--passes:1:5: error: unknown pass 'nope'", 0) == 0);
}

TEST_CASE("the pass manager verifies the graph after each pass", "[passes][pipeline]") {
  auto g = parse("graph @g(%x: f32[4]) {\n  %y = neg(%x) : f32[4]\n  return %y\n}\n");
  PassManager pm;
  pm.addPass(std::make_unique<CorruptingPass>());
  Status s = pm.run(*g);
  REQUIRE_FALSE(s.ok());
  CHECK(s.error() ==
        "error: pass 'corrupt' produced an invalid graph: test.tir:2:8: error: result %y is declared f32[99] but neg "
        "gives f32[4]");
  // Without verification the broken graph goes through (what --no-verify does).
  PipelineConfig noVerify;
  noVerify.verifyEach = false;
  PassManager pm2(noVerify);
  pm2.addPass(std::make_unique<CorruptingPass>());
  CHECK(pm2.run(*g).ok());
}

TEST_CASE("the registry refuses a second pass of the same name", "[passes][registry]") {
  PassRegistry r;
  auto factory = [](const PassOptions&) -> Result<std::unique_ptr<Pass>> { return createDCEPass(); };
  REQUIRE(r.add({"mine", "first", {}, factory}).ok());
  Status again = r.add({"mine", "second", {}, factory});
  REQUIRE_FALSE(again.ok());
  CHECK(again.error() == "built-in: pass 'mine' is already registered by built-in");
  CHECK(r.find("mine")->description == "first");

  // During a plugin's registration the first failure is kept for the loader.
  r.beginOrigin("plugin ./p.so");
  (void)r.add({"mine", "third", {}, factory});
  (void)r.add({"", "nameless", {}, factory});
  Status s = r.endOrigin();
  REQUIRE_FALSE(s.ok());
  CHECK(s.error() == "plugin ./p.so: pass 'mine' is already registered by built-in");
  CHECK(r.endOrigin().ok());
  CHECK(r.all().size() == 1);

  // The global registry holds the built-in passes.
  CHECK(PassRegistry::global().find("cse") != nullptr);
  CHECK(PassRegistry::global().find("dce") != nullptr);
}

TEST_CASE("cse and dce report whether they changed the graph", "[passes][cse][dce]") {
  auto g = parse(R"(graph @g(%x: f32[4], %y: f32[4]) {
  %a = mul(%x, %y) : f32[4]
  %b = mul(%y, %x) : f32[4]
  %c = add(%a, %b) : f32[4]
  %dead = exp(%c) : f32[4]
  return %c
})");
  auto cse = createCSEPass();
  auto dce = createDCEPass();
  auto r1 = cse->run(*g);
  REQUIRE(r1.ok());
  CHECK(*r1 == true);
  CHECK(g->numNodes() == 3);
  auto r2 = cse->run(*g);
  REQUIRE(r2.ok());
  CHECK(*r2 == false);
  auto r3 = dce->run(*g);
  REQUIRE(r3.ok());
  CHECK(*r3 == true);
  auto r4 = dce->run(*g);
  REQUIRE(r4.ok());
  CHECK(*r4 == false);
  CHECK(printGraph(*g) ==
        "graph @g(%x: f32[4], %y: f32[4]) {\n  %a = mul(%x, %y) : f32[4]\n  %c = add(%a, %a) : f32[4]\n  return %c\n}\n");
}

TEST_CASE("the example plugin loads into this process and folds scales", "[passes][plugin]") {
  PassRegistry r;
  Status s = loadPassPlugin(kExamplePlugin, r);
  if (!s.ok()) FAIL(s.error());
  const PassInfo* info = r.find("fold-scales");
  REQUIRE(info != nullptr);
  REQUIRE(info->options.size() == 1);
  CHECK(info->options[0].name == "drop-identity");

  auto g = parse(R"(graph @g(%x: f32[4]) {
  %a = scale(%x) {factor=2.0} : f32[4]
  %b = scale(%a) {factor=3.0} : f32[4]
  %c = scale(%x) {factor=1.0} : f32[4]
  %d = add(%b, %c) : f32[4]
  return %d
})");
  auto changed = runPass(r, "fold-scales", *g);
  if (!changed) FAIL(changed.error());
  CHECK(*changed);
  REQUIRE(createDCEPass()->run(*g).ok());
  CHECK(printGraph(*g) ==
        "graph @g(%x: f32[4]) {\n  %b = scale(%x) {factor=6.0} : f32[4]\n  %d = add(%b, %x) : f32[4]\n  return %d\n}\n");
  auto again = runPass(r, "fold-scales", *g);
  REQUIRE(again.ok());
  CHECK_FALSE(*again);

  // Its option is checked by the plugin's factory.
  PassOptions bad("fold-scales");
  bad.set("drop-identity", "maybe");
  auto made = info->factory(bad);
  REQUIRE_FALSE(made.ok());
  CHECK(made.error() == "pass 'fold-scales': option drop-identity=maybe is not true or false");

  // Loading it a second time, by any path to the same file, is loading it once.
  const size_t passes = r.all().size();
  Status twice = loadPassPlugin(kExamplePlugin, r);
  if (!twice.ok()) FAIL(twice.error());
  test::TempDir dir;
  std::filesystem::create_symlink(kExamplePlugin, dir / "link.so");
  Status linked = loadPassPlugin(dir / "link.so", r);
  if (!linked.ok()) FAIL(linked.error());
  CHECK(r.all().size() == passes);
  CHECK(r.originOf("fold-scales") == "plugin " + kExamplePlugin);

  // Another library (a copy of the file) registering the same pass name is a clash naming both.
  std::filesystem::copy_file(kExamplePlugin, dir / "copy.so");
  Status copy = loadPassPlugin(dir / "copy.so", r);
  REQUIRE_FALSE(copy.ok());
  CHECK(copy.error() == "plugin " + (dir / "copy.so") + ": pass 'fold-scales' is already registered by plugin " + kExamplePlugin);
}

// Where the throwing test plugin throws (TPC_TEST_PLUGIN_THROW), for one scope. Its registerPasses reads the variable
// at each load into a registry that has not loaded it yet.
namespace {
struct ThrowIn {
  explicit ThrowIn(const char* where) { setenv("TPC_TEST_PLUGIN_THROW", where, 1); }
  ~ThrowIn() { unsetenv("TPC_TEST_PLUGIN_THROW"); }
};
}  // namespace

TEST_CASE("a plugin's exception names the plugin and the pass", "[passes][plugin]") {
  // Each load below runs registerPasses again (a fresh registry), which reads the variable then.
  auto g = parse("graph @g(%x: f32[4]) {\n  %y = neg(%x) : f32[4]\n  return %y\n}\n");
  {
    ThrowIn in("register");
    PassRegistry r;
    Status s = loadPassPlugin(kThrowingPlugin, r);
    REQUIRE_FALSE(s.ok());
    CHECK(s.error() == kThrowingPlugin + ": error: pass plugin 'throwing' threw in registerPasses: boom in registerPasses");
    CHECK(r.endOrigin().ok());  // the registry is back to built-in registrations
  }
  PassRegistry r;
  Status s = loadPassPlugin(kThrowingPlugin, r);
  if (!s.ok()) FAIL(s.error());
  const std::string pass = "pass 'throwing-tp' (plugin " + kThrowingPlugin + ")";
  {
    PassManager pm;
    REQUIRE(pm.addPipeline("throwing-tp(tp=2)", "--passes", r).ok());
    Status run = pm.run(*g);
    REQUIRE_FALSE(run.ok());
    CHECK(run.error() == "error: " + pass + " threw: boom in run");
  }
  {
    ThrowIn in("run-int");
    PassManager pm;
    REQUIRE(pm.addPipeline("throwing-tp", "--passes", r).ok());
    Status run = pm.run(*g);
    REQUIRE_FALSE(run.ok());
    CHECK(run.error() == "error: " + pass + " threw an exception that is not a std::exception");
  }
  {
    ThrowIn in("create");
    PassManager pm;
    Status add = pm.addPipeline("throwing-tp", "--passes", r);
    REQUIRE_FALSE(add.ok());
    CHECK(add.error() == "--passes:1:1: error: " + pass + " threw: boom in create");
    PassManager own;  // a pipeline tpc built (the policy of tpc run's): no place
    Status built = own.addPipeline("throwing-tp", "", r);
    REQUIRE_FALSE(built.ok());
    CHECK(built.error() == pass + " threw: boom in create");
  }
}

TEST_CASE("a plugin that fails half-way through registering registers nothing", "[passes][plugin]") {
  PassRegistry r;
  registerBuiltinPasses(r);
  const size_t builtins = r.all().size();
  const std::string cseHelp = r.find("cse")->description;
  {
    ThrowIn in("register-after-add");  // adds throwing-tp, then throws
    Status s = loadPassPlugin(kThrowingPlugin, r);
    REQUIRE_FALSE(s.ok());
    CHECK(s.error() == kThrowingPlugin + ": error: pass plugin 'throwing' threw in registerPasses: boom after adding throwing-tp");
    CHECK(r.find("throwing-tp") == nullptr);
    CHECK(r.originOf("throwing-tp") == "");
    CHECK(r.all().size() == builtins);
  }
  {
    ThrowIn in("clash");  // adds throwing-tp, then a second cse, which is refused
    Status s = loadPassPlugin(kThrowingPlugin, r);
    REQUIRE_FALSE(s.ok());
    CHECK(s.error() == "plugin " + kThrowingPlugin + ": pass 'cse' is already registered by built-in");
    CHECK(r.find("throwing-tp") == nullptr);
    CHECK(r.originOf("cse") == "built-in");  // the pass it clashed with stays, untouched
    CHECK(r.find("cse")->description == cseHelp);
    CHECK(r.all().size() == builtins);
  }
  // The same library, now registering cleanly, and then another plugin: no half-registered pass is in their way
  // (throwing-tp left behind would clash with itself), and each pass names its own plugin.
  Status again = loadPassPlugin(kThrowingPlugin, r);
  if (!again.ok()) FAIL(again.error());
  CHECK(r.originOf("throwing-tp") == "plugin " + kThrowingPlugin);
  Status good = loadPassPlugin(kExamplePlugin, r);
  if (!good.ok()) FAIL(good.error());
  CHECK(r.originOf("fold-scales") == "plugin " + kExamplePlugin);
  CHECK(r.all().size() == builtins + 2);
  PassManager pm;
  CHECK(pm.addPipeline("throwing-tp(tp=2),fold-scales", "--passes", r).ok());

  // The registry on its own: an origin the loader marks failed loses what it added, and only that.
  r.beginOrigin("plugin ./p.so");
  REQUIRE(r.add({"mine", "added, then dropped", {}, [](const PassOptions&) -> Result<std::unique_ptr<Pass>> {
                   return createDCEPass();
                 }}).ok());
  CHECK(r.endOrigin(/*failed=*/true).ok());
  CHECK(r.find("mine") == nullptr);
  CHECK(r.all().size() == builtins + 2);
}

TEST_CASE("a plugin built for another API version is refused", "[passes][plugin]") {
  PassRegistry r;
  Status s = loadPassPlugin(kApi999Plugin, r);
  REQUIRE_FALSE(s.ok());
  CHECK(s.error() == kApi999Plugin + ": error: pass plugin 'fold-scales' was built for plugin API version 999, but this tpc " +
                         "has API version " + std::to_string(TPC_PASS_PLUGIN_API_VERSION) +
                         "; rebuild the plugin against this tpc's headers");
  CHECK(r.find("fold-scales") == nullptr);
}

TEST_CASE("missing files and libraries that are not plugins are refused", "[passes][plugin]") {
  PassRegistry r;
  Status notPlugin = loadPassPlugin(kNotAPlugin, r);
  REQUIRE_FALSE(notPlugin.ok());
  CHECK(notPlugin.error() ==
        kNotAPlugin + ": error: not a tpc pass plugin (it does not export `extern \"C\" tpcPassPluginInfo()`)");

  Status missing = loadPassPlugin("/nonexistent/libnothing.so", r);
  REQUIRE_FALSE(missing.ok());
  CHECK(missing.error() == "/nonexistent/libnothing.so: error: pass plugin not found (check the --pass-plugin path)");

  Status dir = loadPassPlugin(TPC_TEST_PLUGIN_DIR, r);
  REQUIRE_FALSE(dir.ok());
  CHECK(dir.error() == std::string(TPC_TEST_PLUGIN_DIR) + ": error: pass plugin is not a regular file");

  // Not a shared library at all: dlopen's reason, on the same line.
  std::string text = test::sourcePath("tests/ir/gpt_block.tir");
  Status notElf = loadPassPlugin(text, r);
  REQUIRE_FALSE(notElf.ok());
  CHECK(notElf.error().rfind(text + ": error: cannot load pass plugin: ", 0) == 0);
  CHECK(notElf.error().find('\n') == std::string::npos);
  CHECK(r.all().empty());
}
