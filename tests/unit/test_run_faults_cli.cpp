// `tpc run` when a step goes wrong: --on-nan stop|skip on a NaN (injected through TPC_TEST_FAULT, and a
// real divergence from a huge learning rate), and --collective-timeout ending a stuck collective with an
// error naming rank, op and step instead of a hang.
#include <algorithm>
#include <chrono>
#include <sstream>

#include <catch2/catch.hpp>

#include "ir/json_text.h"
#include "test_support.h"

namespace tpc {
namespace {

std::string tiny() { return test::binaryPath("models/tiny.fb"); }
// --eval-interval 0: the fault is injected into the training step, whose values the evaluation's graph lacks.
std::string tpcRun(const std::string& env, const std::string& args) {
  return env + " " + test::tpcBinary() + " run " + tiny() + " --eval-interval 0 " + args;
}
long lines(const std::string& s) { return std::count(s.begin(), s.end(), '\n'); }

// The value the NaN goes into: a gradient, named by autodiff as d.<parameter>.
const char* kGrad = "%d.wpe";

TEST_CASE("tpc run --on-nan stop: exit 1 naming the step and the first non-finite value", "[run][cli][nonfinite]") {
  auto r = test::runCommand(tpcRun(std::string("TPC_TEST_FAULT=step=3,nan=") + kGrad,
                                   "--train-iters 4 --log-interval 1 --lr-warmup-iters 0"));
  INFO(r.out << r.err);
  CHECK(r.exitCode == 1);
  CHECK(lines(r.err) == 1);
  CHECK(r.err.rfind("tpc run: error: step 3: the loss is ", 0) == 0);
  CHECK(r.err.find(" and the gradient norm nan; the first non-finite value of the step is " + std::string(kGrad) + " = ") !=
        std::string::npos);
  CHECK(r.err.find(": nan at element 0") != std::string::npos);
  CHECK(r.out.find("step      2/4 | loss ") != std::string::npos);  // steps before it ran
  CHECK(r.out.find("step      3/4") == std::string::npos);
}

TEST_CASE("tpc run --on-nan skip: the step is logged as skipped and training goes on", "[run][cli][nonfinite]") {
  test::TempDir dir;
  std::string log = dir / "skip.jsonl";
  auto r = test::runCommand(tpcRun(std::string("TPC_TEST_FAULT=step=3,nan=") + kGrad,
                                   "--train-iters 5 --log-interval 1 --lr-warmup-iters 0 --on-nan skip --log-jsonl " + log));
  INFO(r.out << r.err);
  REQUIRE(r.exitCode == 0);
  CHECK(r.out.find("step      3/5 | skipped: loss ") != std::string::npos);
  CHECK(r.out.find("step      4/5 | loss ") != std::string::npos);
  CHECK(r.out.find("done: 5 steps in ") != std::string::npos);
  CHECK(r.out.find("; 1 of them skipped (non-finite), their updates dropped\n") != std::string::npos);
  std::string jsonl = test::readFile(log);
  // The fault is in a gradient: the loss is finite and logged as the console shows it; the norm is null.
  const std::string consoleLoss = r.out.substr(r.out.find("skipped: loss ") + 14);
  CHECK(jsonl.find("{\"step\": 3, \"skipped\": true, \"loss\": " + consoleLoss.substr(0, consoleLoss.find(',')).substr(0, 5)) !=
        std::string::npos);
  CHECK_THAT(jsonl, Catch::Matchers::Contains("\"grad_norm\": null"));
  CHECK(jsonl.find("{\"step\": 5, \"loss\": ") != std::string::npos);

  // The skipped step changed nothing: steps 4 and 5 match a run whose step 3 is a clean step...
  // ...is not checkable here (the batch of step 3 is consumed either way); the backend unit tests compare
  // the state bit for bit. Here: the same faulty run twice gives the same losses (the skip is deterministic).
  auto again = test::runCommand(tpcRun(std::string("TPC_TEST_FAULT=step=3,nan=") + kGrad,
                                       "--train-iters 5 --log-interval 1 --lr-warmup-iters 0 --on-nan skip"));
  REQUIRE(again.exitCode == 0);
  auto losses = [](const std::string& out) {
    std::string s;
    for (size_t p = out.find("| loss "); p != std::string::npos; p = out.find("| loss ", p + 1)) s += out.substr(p, 14);
    return s;
  };
  CHECK(losses(again.out) == losses(r.out));
}

// The audit of the thirty-ninth session: a diverged run's validation loss went into the log as -nan, which no JSON
// reader takes (tpc plot refused the log), and /metrics showed it as -nan, which Prometheus refuses. JSON has no NaN:
// the log says null, as for a skipped step's values; Prometheus spells it NaN.
TEST_CASE("tpc run: a diverged run's log is JSON on every line, a non-finite figure null", "[run][cli][nonfinite]") {
  test::TempDir dir;
  const std::string log = dir / "nan.jsonl";
  auto r = test::runCommand(test::tpcBinary() + " run " + tiny() + " --train-iters 4 --seq-length 16 --micro-batch-size 2 "
                            "--eval-interval 2 --eval-iters 1 --log-interval 1 --lr-warmup-iters 0 --clip-grad 0 --lr 1e30 "
                            "--min-lr 0 --on-nan skip --log-jsonl " + log);
  INFO(r.out << r.err);
  REQUIRE(r.exitCode == 0);
  const std::string text = test::readFile(log);
  std::istringstream in(text);
  int lines = 0;
  for (std::string line; std::getline(in, line); ++lines) {
    INFO(line);
    CHECK(parseJsonText(line).ok());
  }
  CHECK(lines >= 6);  // 4 steps, 2 evaluations
  CHECK_THAT(text, Catch::Matchers::Contains("{\"step\": 2, \"valid_loss\": null, \"valid_ppl\": null}"));
  CHECK(test::runCommand(test::tpcBinary() + " plot " + log + " -o " + (dir / "nan.svg")).exitCode == 0);
}

TEST_CASE("tpc run: a huge learning rate diverges and --on-nan stop names the step", "[run][cli][nonfinite]") {
  auto r = test::runCommand(tpcRun("", "--train-iters 6 --log-interval 1 --lr 1e30 --min-lr 1e30 --lr-warmup-iters 0 "
                                       "--clip-grad 0"));
  INFO(r.out << r.err);
  CHECK(r.exitCode == 1);
  CHECK(lines(r.err) == 1);
  CHECK(r.err.find("tpc run: error: step ") == 0);
  CHECK(r.err.find("the first non-finite value of the step is %") != std::string::npos);
}

TEST_CASE("tpc run: bad --on-nan and --collective-timeout values are one error line", "[run][cli][nonfinite]") {
  const std::pair<const char*, const char*> cases[] = {
      {"--on-nan ignore", "tpc run: error: --on-nan=ignore is not a policy (expected stop or skip)\n"},
      {"--collective-timeout 0", "tpc run: error: --collective-timeout=0 is out of range: give seconds in [0.001, 86400]\n"},
      {"--collective-timeout -5", "tpc run: error: --collective-timeout=-5 is out of range: give seconds in [0.001, 86400]\n"},
      {"--collective-timeout nan", "tpc run: error: --collective-timeout=nan is out of range: give seconds in [0.001, 86400]\n"},
      {"--collective-timeout 1e9", "tpc run: error: --collective-timeout=1e9 is out of range: give seconds in [0.001, 86400]\n"},
      {"--collective-timeout soon", "tpc run: error: --collective-timeout=soon is not a number\n"},
  };
  for (const auto& [args, expected] : cases) {
    auto r = test::runCommand(tpcRun("", std::string("--train-iters 1 ") + args));
    INFO(args);
    CHECK(r.exitCode == 1);
    CHECK(r.err == expected);
  }
  auto r = test::runCommand(tpcRun("TPC_TEST_FAULT=step=1,explode=1", "--train-iters 1"));
  CHECK(r.exitCode == 1);
  CHECK(r.err.find("TPC_TEST_FAULT=step=1,explode=1: unknown key 'explode'") != std::string::npos);
}

TEST_CASE("tpc run --collective-timeout: a stuck rank ends the run with rank, op and step, never a hang",
          "[run][cli][mesh]") {
  auto t0 = std::chrono::steady_clock::now();
  auto r = test::runCommand(tpcRun("TPC_TEST_FAULT=step=2,stall-rank=1",
                                   "--tp 2 --train-iters 3 --log-interval 1 --collective-timeout 1.5"));
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  INFO(r.out << r.err);
  CHECK(r.exitCode == 1);
  CHECK(lines(r.err) == 1);
  // Rank 0 waits for rank 1 at its first collective of step 2 and gives up after 1.5 s.
  CHECK(r.err.rfind("tpc run: error: rank 0 (tp=0): ", 0) == 0);
  CHECK(r.err.find(" at step 2 did not complete within 1.5 s: rank(s) 1 of the group never arrived") != std::string::npos);
  CHECK(r.out.find("step      1/3 | loss ") != std::string::npos);
  CHECK(seconds < 60);  // the default timeout is 60 s: the flag took effect
}

TEST_CASE("tpc run: a crafted model whose state cannot fit is refused before anything is allocated", "[run][cli]") {
  // The model-file reader accepts shapes of up to 2^50 elements; an unused f32[2^40, 64] parameter (and its
  // two AdamW moments) would need 768 TiB. Before the check, tpc run died of std::bad_alloc (exit 134).
  test::TempDir dir;
  std::string model = dir / "huge.json";
  REQUIRE(test::runCommand(test::tpcBinary() + " new gpt --preset tiny -o " + model).exitCode == 0);
  std::string text = test::readFile(model);
  size_t end = text.find("\n    ],\n    \"nodes\"");
  REQUIRE(end != std::string::npos);
  text.insert(end, ",\n      {\"name\": \"huge\", \"kind\": \"param\", \"dtype\": \"f32\", \"shape\": [1099511627776, 64]}");
  // A graph of its own: without the arch block (which does not have %huge, and is refused if it disagrees).
  text = test::withoutArchBlock(text);
  REQUIRE(!text.empty());
  test::writeFile(model, text);
  auto r = test::runCommand(test::tpcBinary() + " run " + model + " --train-iters 1");
  INFO(r.out << r.err);
  CHECK(r.exitCode == 1);
  CHECK(lines(r.err) == 1);
  CHECK(r.err.rfind(model + ": error: the parameters and optimizer state need 786432.0 GiB, more than this machine's ", 0) == 0);
  CHECK(r.err.find("(the largest, %huge, is f32[1099511627776,64]: 262144.0 GiB); make the model smaller\n") !=
        std::string::npos);
}

// Every logged loss and gradient norm, at full precision (9 digits: exact for an f32).
std::string lossesOf(const std::string& jsonl) {
  std::string s;
  for (const char* key : {"\"loss\": ", "\"grad_norm\": "})
    for (size_t p = jsonl.find(key); p != std::string::npos; p = jsonl.find(key, p + 1))
      s += jsonl.substr(p, jsonl.find(',', p) - p) + ";";
  return s;
}

TEST_CASE("tpc run: the same seed gives bit-identical losses, whatever --threads", "[run][cli][determinism]") {
  test::TempDir dir;
  auto run = [&](const std::string& args, const std::string& name) {
    std::string log = dir / name;
    auto r = test::runCommand(tpcRun("", "--train-iters 4 --log-interval 1 --seed 11 --log-jsonl " +
                                         log + " " + args));
    INFO(args << "\n" << r.out << r.err);
    REQUIRE(r.exitCode == 0);
    return lossesOf(test::readFile(log));
  };
  std::string one = run("--threads 1", "t1.jsonl");
  CHECK(one.size() > 100);
  CHECK(run("--threads 2", "t2.jsonl") == one);
  CHECK(run("--threads 3", "t3.jsonl") == one);
  std::string tp = run("--tp 2 --threads 2", "tp2a.jsonl");
  CHECK(run("--tp 2 --threads 3", "tp2b.jsonl") == tp);
}

}  // namespace
}  // namespace tpc
