// A user's sharding strategy as a plugin (examples/sharding-plugin, `mlp-tp`): loaded by `tpc run`/`tpc dump`
// with --pass-plugin, chosen with --sharding-policy, trained end to end at tp 2 with tp 1's losses; and the
// flag's user errors.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>

#include <catch2/catch.hpp>

#include "test_support.h"

namespace tpc {
namespace {

std::string tiny() { return test::binaryPath("models/tiny.fb"); }
std::string plugin() { return test::binaryPath("examples/libtpc_mlp_tp.so"); }

}  // namespace

TEST_CASE("sharding plugin: mlp-tp trains at tp 2 with tp 1's losses", "[sharding][plugin][cli]") {
  test::TempDir dir;
  const std::string common = " run " + tiny() + " --train-iters 4 --log-interval 1 --seed 3 --log-jsonl ";
  auto one = test::runCommand(test::tpcBinary() + common + (dir / "tp1.jsonl"));
  INFO(one.out << one.err);
  REQUIRE(one.exitCode == 0);
  auto two = test::runCommand(test::tpcBinary() + common + (dir / "tp2.jsonl") + " --tp 2 --pass-plugin " + plugin() +
                              " --sharding-policy mlp-tp");
  INFO(two.out << two.err);
  REQUIRE(two.exitCode == 0);
  // The user's policy replaced megatron-tp in the pipeline, and the step ran partitioned over two ranks.
  CHECK(two.out.find("passes: mlp-tp(tp=2),autodiff(") != std::string::npos);
  CHECK(two.out.find("megatron-tp") == std::string::npos);
  CHECK(two.out.find(" ops on backend cpu (2 ranks) over mesh(tp=2)\n") != std::string::npos);
  auto a = test::jsonlField(test::readFile(dir / "tp1.jsonl"), "loss"), b = test::jsonlField(test::readFile(dir / "tp2.jsonl"), "loss");
  REQUIRE(a.size() == 4);
  REQUIRE(b.size() == 4);
  for (size_t i = 0; i < a.size(); ++i) {
    INFO("step " << i + 1 << ": tp 1 loss " << a[i] << ", tp 2 (mlp-tp) loss " << b[i]);
    CHECK(std::abs(a[i] - b[i]) <= 1e-5 * std::abs(a[i]));
  }
  CHECK(a.back() < a.front());  // it trained
}

TEST_CASE("sharding plugin: mlp-tp's collectives are the MLPs' all_reduces only", "[sharding][plugin][cli]") {
  auto r = test::runCommand(test::tpcBinary() + " dump " + tiny() + " --tp 2 --pass-plugin " + plugin() +
                            " --sharding-policy mlp-tp --after=partition --summary");
  INFO(r.out << r.err);
  REQUIRE(r.exitCode == 0);
  // tiny has 2 layers: per layer fc2's output (forward) and fc1's input grad (backward); plus the grad norm.
  CHECK(r.out.find("all_reduce(tp, sum): 5 ops") != std::string::npos);
  CHECK(std::count(r.out.begin(), r.out.end(), '\n') == 3);  // header, that line, total: nothing else
  // The plugin named without a folder, from the folder it is in: loaded as that file, not searched for.
  const std::string path = plugin(), folder = path.substr(0, path.rfind('/')), name = path.substr(path.rfind('/') + 1);
  auto bare = test::runCommand("cd " + folder + " && " + test::tpcBinary() + " dump " + tiny() + " --tp 2 --pass-plugin " +
                               name + " --sharding-policy mlp-tp --after=partition --summary");
  INFO(bare.err);
  CHECK(bare.exitCode == 0);
  CHECK(bare.out == r.out);
}

TEST_CASE("sharding plugin: --sharding-policy errors name the flag and the fix", "[sharding][plugin][cli]") {
  struct Case {
    std::string args, expected;
  };
  const Case cases[] = {
      {" --tp 2 --sharding-policy mlp-tp", "--sharding-policy=mlp-tp: no pass of that name is registered"},
      {" --tp 2 --sharding-policy mlp-tp", "load the plugin that defines it with --pass-plugin=lib.so"},
      {" --pass-plugin " + plugin() + " --sharding-policy mlp-tp", "--sharding-policy=mlp-tp needs --tp N with N > 1"},
      // --sp at tp 1 does nothing, so the policy would not run either.
      {" --pass-plugin " + plugin() + " --sharding-policy mlp-tp --sp", "--sharding-policy=mlp-tp needs --tp N with N > 1"},
      {" --tp 2 --pass-plugin /nonexistent/libx.so", "/nonexistent/libx.so"},
      {" --tp 2 --sharding-policy cse", "--sharding-policy=cse: pass 'cse' has no option tp, so it is not a sharding policy"},
  };
  for (std::string cmd : {" run ", " dump "})
    for (const Case& c : cases) {
      auto r = test::runCommand(test::tpcBinary() + cmd + tiny() + c.args + (cmd == " dump " ? " --after=partition" : ""));
      INFO("tpc" << cmd << c.args << "\nstderr: " << r.err);
      CHECK(r.exitCode == 1);
      CHECK(std::count(r.err.begin(), r.err.end(), '\n') == 1);
      CHECK(r.err.find(c.expected) != std::string::npos);
    }
}

TEST_CASE("sharding plugin: the default policy named at tp 1 is as if not named", "[sharding][plugin][cli]") {
  // Scripts that always pass --sharding-policy megatron-tp run at tp 1 too; another policy there is still refused
  // (above): it would never run.
  for (std::string cmd : {" run ", " dump "}) {
    const std::string base = test::tpcBinary() + cmd + tiny() + (cmd == " run " ? " --train-iters 1" : " --summary");
    auto plain = test::runCommand(base);
    auto named = test::runCommand(base + " --sharding-policy megatron-tp");
    INFO("tpc" << cmd << "\nstderr: " << named.err);
    REQUIRE(plain.exitCode == 0);
    CHECK(named.exitCode == 0);
    CHECK(named.err == plain.err);
    if (cmd == " dump ") CHECK(named.out == plain.out);
  }
}

TEST_CASE("sharding plugin: one library named twice loads once, two libraries with one pass name clash", "[sharding][plugin][cli]") {
  test::TempDir dir;
  std::filesystem::copy_file(plugin(), dir / "libcopy.so");
  const std::string dump = test::tpcBinary() + " dump " + tiny() + " --tp 2 --sharding-policy mlp-tp --summary";
  auto once = test::runCommand(dump + " --pass-plugin " + plugin());
  REQUIRE(once.exitCode == 0);
  auto twice = test::runCommand(dump + " --pass-plugin " + plugin() + " --pass-plugin " + plugin());
  INFO(twice.err);
  CHECK(twice.exitCode == 0);
  CHECK(twice.out == once.out);
  auto clash = test::runCommand(dump + " --pass-plugin " + plugin() + " --pass-plugin " + (dir / "libcopy.so"));
  CHECK(clash.exitCode == 1);
  CHECK(clash.err == "tpc dump: error: plugin " + (dir / "libcopy.so") + ": pass 'mlp-tp' is already registered by plugin " +
                         plugin() + "\n");
}

TEST_CASE("sharding plugin: a plugin none of whose passes is the policy is said to do nothing", "[sharding][plugin][cli]") {
  test::TempDir dir;
  auto r = test::runCommand(test::tpcBinary() + " run " + tiny() + " --train-iters 1 --eval-interval 0 --pass-plugin " +
                            plugin() + " --log-jsonl " + (dir / "log.jsonl"));
  INFO(r.err);
  CHECK(r.exitCode == 0);
  CHECK(r.err == "tpc run: warning: --pass-plugin " + plugin() + " registers mlp-tp, but none is the --sharding-policy "
                 "(megatron-tp), the one place a plugin's pass runs here: the plugin does nothing; give "
                 "--sharding-policy NAME --tp N\n");
  // Named as the policy, or in dump's own pass list, it runs: nothing to say.
  auto used = test::runCommand(test::tpcBinary() + " dump " + tiny() + " --tp 2 --pass-plugin " + plugin() +
                               " --sharding-policy mlp-tp --summary");
  CHECK(used.exitCode == 0);
  CHECK(used.err.empty());
}

TEST_CASE("sharding plugin: a plugin that throws is named in the one error line", "[sharding][plugin][cli]") {
  const std::string throwing = std::string(TPC_TEST_BAD_PLUGIN_DIR) + "/libtpc_throwing_plugin.so";
  const std::string args = " --tp 2 --pass-plugin " + throwing + " --sharding-policy throwing-tp";
  auto run = test::runCommand(test::tpcBinary() + " run " + tiny() + args);
  CHECK(run.exitCode == 1);
  CHECK(run.err == tiny() + ": error: pass 'throwing-tp' (plugin " + throwing + ") threw: boom in run\n");
  auto reg = test::runCommand("TPC_TEST_PLUGIN_THROW=register " + test::tpcBinary() + " run " + tiny() + args);
  CHECK(reg.exitCode == 1);
  CHECK(reg.err == throwing + ": error: pass plugin 'throwing' threw in registerPasses: boom in registerPasses\n");
  auto info = test::runCommand("TPC_TEST_PLUGIN_THROW=info " + test::tpcBinary() + " run " + tiny() + args);
  CHECK(info.exitCode == 1);
  CHECK(info.err == throwing + ": error: pass plugin threw in tpcPassPluginInfo(): boom in info\n");
  // Its factory: tpc run built the pipeline itself, so no place in a --passes text the user never gave.
  auto create = test::runCommand("TPC_TEST_PLUGIN_THROW=create " + test::tpcBinary() + " run " + tiny() + args);
  CHECK(create.exitCode == 1);
  CHECK(create.err == "tpc run: error: pass 'throwing-tp' (plugin " + throwing + ") threw: boom in create\n");
  // tpc dump's standard pipeline is tpc's text too; with --passes the user's text is the place.
  auto dump = test::runCommand("TPC_TEST_PLUGIN_THROW=create " + test::tpcBinary() + " dump " + tiny() + args);
  CHECK(dump.exitCode == 1);
  CHECK(dump.out.empty());
  CHECK(dump.err == "tpc dump: error: pass 'throwing-tp' (plugin " + throwing + ") threw: boom in create\n");
  auto given = test::runCommand("TPC_TEST_PLUGIN_THROW=create " + test::tpcBinary() + " dump " + tiny() + args +
                                " --passes='autodiff,throwing-tp(tp=2)'");
  CHECK(given.exitCode == 1);
  CHECK(given.err == "--passes:1:10: error: pass 'throwing-tp' (plugin " + throwing + ") threw: boom in create\n");
}

TEST_CASE("sharding plugin: a factory's error or null pass is named with the pass and the plugin", "[sharding][plugin][cli]") {
  const std::string throwing = std::string(TPC_TEST_BAD_PLUGIN_DIR) + "/libtpc_throwing_plugin.so";
  const std::string args = " --tp 2 --pass-plugin " + throwing + " --sharding-policy throwing-tp";
  auto error = test::runCommand("TPC_TEST_PLUGIN_THROW=create-error " + test::tpcBinary() + " run " + tiny() + args);
  CHECK(error.exitCode == 1);
  CHECK(error.err == "tpc run: error: pass 'throwing-tp' (plugin " + throwing + "): tp must be even\n");
  // A null pass was stored and crashed the pipeline's run (SIGSEGV).
  auto null = test::runCommand("TPC_TEST_PLUGIN_THROW=create-null " + test::tpcBinary() + " dump " + tiny() + args +
                               " --passes='autodiff,throwing-tp(tp=2)'");
  CHECK(null.exitCode == 1);
  CHECK(null.out.empty());
  CHECK(null.err == "--passes:1:10: error: pass 'throwing-tp' (plugin " + throwing +
                        "): its factory returned no pass (a null pointer)\n");
}

}  // namespace tpc
