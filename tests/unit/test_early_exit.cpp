// Ending a run early as Megatron-LM does (--exit-interval, --exit-duration-in-mins, --exit-signal-handler): the run
// stops after a whole step with a checkpoint there, and going on from it gives the uninterrupted run's losses.
#include <catch2/catch.hpp>

#include <filesystem>
#include <string>
#include <vector>

#include "test_support.h"

namespace tpc {
namespace {

const char* kStop = "stopped after step ";

// tiny.fb trained in the background with `flags`, its output in `log`, sent SIGTERM once its second step is logged;
// the result's exit status is the run's.
test::CommandResult runUntilSigterm(const std::string& flags, const std::string& log) {
  const std::string script =
      test::tpcBinary() + " run " + test::binaryPath("models/tiny.fb") + " --threads 2 --log-interval 1 --train-iters 100000 "
      "--eval-interval 0 " + flags + " > " + log + " 2>&1 & pid=$!; "
      "for i in $(seq 600); do grep -q \"step      2/\" " + log + " && break; sleep 0.1; done; "
      "kill -TERM $pid; wait $pid";
  return test::runCommand("bash -c '" + script + "'");
}

TEST_CASE("tpc run --exit-interval: stops with a checkpoint, and going on gives the uninterrupted losses",
          "[run][cli][exit]") {
  test::TempDir dir;
  const std::string d = dir.path.string(), common = "--train-iters 7 --eval-interval 2 --eval-iters 1 --seed 3 ";
  auto whole = test::runTiny(common + "--log-jsonl " + d + "/whole.jsonl");
  REQUIRE(whole.exitCode == 0);
  const std::vector<double> expected = test::jsonlField(test::readFile(d + "/whole.jsonl"), "loss");
  REQUIRE(expected.size() == 7);

  auto first = test::runTiny(common + "--exit-interval 3 --save " + d + "/ck --log-jsonl " + d + "/a.jsonl");
  INFO(first.out << first.err);
  REQUIRE(first.exitCode == 0);
  CHECK(first.out.find("stopped after step 3 of 7: --exit-interval 3 (step 3); checkpoint in " + d +
                       "/ck; go on with the same command and --load " + d + "/ck\n") != std::string::npos);
  CHECK(first.out.find("step      4/7") == std::string::npos);
  CHECK(first.out.find("test loss") == std::string::npos);  // the run is not over
  CHECK(first.out.find("eval at step 3") == std::string::npos);
  CHECK(first.out.find("done: 3 steps") != std::string::npos);
  CHECK(test::readFile(d + "/ck/latest_checkpointed_iteration.txt").find('3') != std::string::npos);

  // The same command with --load: stops again at 6, then the last step.
  auto second = test::runTiny(common + "--exit-interval 3 --save " + d + "/ck --load " + d + "/ck --log-jsonl " + d + "/b.jsonl");
  INFO(second.out << second.err);
  REQUIRE(second.exitCode == 0);
  CHECK(second.out.find(std::string(kStop) + "6 of 7") != std::string::npos);
  CHECK(second.out.find("eval at step 6") != std::string::npos);  // evaluated before it stops, as Megatron-LM does
  auto third = test::runTiny(common + "--exit-interval 3 --save " + d + "/ck --load " + d + "/ck --log-jsonl " + d + "/c.jsonl");
  INFO(third.out << third.err);
  REQUIRE(third.exitCode == 0);
  CHECK(third.out.find(kStop) == std::string::npos);  // 7 is the last step: no stop, the test split evaluated
  std::vector<double> pieces;
  for (const char* f : {"/a.jsonl", "/b.jsonl", "/c.jsonl"})
    for (double l : test::jsonlField(test::readFile(d + f), "loss")) pieces.push_back(l);
  CHECK(pieces == expected);  // bit for bit on the CPU backend

  // Without --save: it stops, and says that nothing was saved.
  auto unsaved = test::runTiny("--train-iters 5 --eval-interval 0 --exit-interval 2");
  REQUIRE(unsaved.exitCode == 0);
  CHECK(unsaved.out.find("stopped after step 2 of 5: --exit-interval 2 (step 2); nothing saved (no --save)") !=
        std::string::npos);
}

TEST_CASE("tpc run --exit-interval: a skipped step still stops the run and is saved", "[run][cli][exit]") {
  test::TempDir dir;
  const std::string ck = dir.path.string() + "/ck";
  // Step 3's loss is a NaN (--on-nan skip drops its update); the run stops there all the same, with a checkpoint.
  auto r = test::runCommand("TPC_TEST_FAULT=step=3,nan=%d.wte " + test::tpcBinary() + " run " +
                            test::binaryPath("models/tiny.fb") + " --threads 2 --log-interval 1 --train-iters 8 "
                            "--eval-interval 0 --on-nan skip --exit-interval 3 --save " + ck);
  INFO(r.out << r.err);
  REQUIRE(r.exitCode == 0);
  CHECK(r.out.find("step      3/8 | skipped") != std::string::npos);
  CHECK(r.out.find("stopped after step 3 of 8: --exit-interval 3 (step 3)") != std::string::npos);
  CHECK(test::readFile(ck + "/latest_checkpointed_iteration.txt").find('3') != std::string::npos);

  // A stop before any step was applied (step 1 skipped) is a stop, not the "every step was skipped" failure.
  auto first = test::runCommand("TPC_TEST_FAULT=step=1,nan=%d.wte " + test::tpcBinary() + " run " +
                                test::binaryPath("models/tiny.fb") + " --threads 2 --log-interval 1 --train-iters 6 "
                                "--eval-interval 0 --on-nan skip --exit-interval 1 --save " + ck + "1");
  INFO(first.out << first.err);
  CHECK(first.exitCode == 0);
  CHECK(first.out.find("stopped after step 1 of 6: --exit-interval 1 (step 1)") != std::string::npos);
  CHECK(first.out.find("done: 1 steps in ") != std::string::npos);
  CHECK(test::readFile(ck + "1/latest_checkpointed_iteration.txt").find('1') != std::string::npos);
}

TEST_CASE("tpc run --exit-duration-in-mins stops once the run has taken that long", "[run][cli][exit]") {
  test::TempDir dir;
  // 0.0001 minutes (6 ms) pass before the first step ends.
  auto r = test::runTiny("--train-iters 50 --eval-interval 0 --exit-duration-in-mins 0.0001 --save " + dir.path.string() + "/ck");
  INFO(r.out << r.err);
  REQUIRE(r.exitCode == 0);
  CHECK(r.out.find("stopped after step 1 of 50: --exit-duration-in-mins 0.0001 (the run passed it)") != std::string::npos);
  CHECK(std::filesystem::exists(dir.path / "ck/iter_0000001/model.safetensors"));
  for (const char* bad : {"0", "-2", "nan", "soon"}) {
    auto e = test::runTiny(std::string("--exit-duration-in-mins ") + bad);
    INFO(bad << ": " << e.err);
    CHECK(e.exitCode == 1);
    CHECK(e.err.find("--exit-duration-in-mins") != std::string::npos);
  }
  auto e = test::runTiny("--exit-interval 0");
  CHECK(e.exitCode == 1);
  CHECK(e.err.find("--exit-interval=0 must be >= 1") != std::string::npos);
}

TEST_CASE("tpc run --exit-signal-handler: SIGTERM ends the run after the step, with a checkpoint", "[run][cli][exit]") {
  test::TempDir dir;
  const std::string d = dir.path.string();
  auto r = runUntilSigterm("--exit-signal-handler --save " + d + "/ck", d + "/out.log");
  const std::string out = test::readFile(d + "/out.log");
  INFO(out << r.err);
  REQUIRE(r.exitCode == 0);
  const size_t at = out.find(kStop);
  REQUIRE(at != std::string::npos);
  CHECK(out.find("of 100000: the signal SIGTERM (--exit-signal-handler); checkpoint in " + d + "/ck", at) != std::string::npos);
  const long step = std::stol(out.substr(at + std::string(kStop).size()));
  CHECK(step >= 2);
  CHECK(test::readFile(d + "/ck/latest_checkpointed_iteration.txt").find(std::to_string(step)) != std::string::npos);

  // Without the flag SIGTERM ends the run at once, as before: killed by the signal, no checkpoint.
  auto killed = runUntilSigterm("--save " + d + "/ck2", d + "/plain.log");
  CHECK(killed.exitCode == 128 + 15);
  CHECK(test::readFile(d + "/plain.log").find(kStop) == std::string::npos);
  CHECK_FALSE(std::filesystem::exists(dir.path / "ck2/latest_checkpointed_iteration.txt"));
}

}  // namespace
}  // namespace tpc
