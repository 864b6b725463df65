// Megatron-LM's flags that `tpc run` takes with Megatron-LM's meaning: the schedule in samples or as a warmup
// fraction, --pipeline-model-parallel-size 1, --distributed-backend nccl; and their refusals.
#include <algorithm>

#include <catch2/catch.hpp>

#include "test_support.h"

namespace tpc {
namespace {

std::string tiny() { return test::binaryPath("models/tiny.fb"); }

// The lr of each step of a run of `args` on tiny.fb (global batch 8, lr 0.001 -> 0.0001 cosine), logged every step.
std::vector<double> stepLrs(const std::string& args, test::CommandResult& r) {
  test::TempDir dir;
  r = test::runTiny(args + " --eval-interval 0 --log-jsonl " + dir / "log.jsonl");
  return test::jsonlField(test::readFile(dir / "log.jsonl"), "lr");
}

}  // namespace

TEST_CASE("tpc run: --train-samples and --lr-warmup-fraction give Megatron-LM's steps and warmup", "[run][cli][megatron]") {
  // 32 samples of a global batch of 8: 4 steps; a warmup of 0.5 x the 4 decay steps: 2 steps.
  test::CommandResult r;
  const std::vector<double> lrs = stepLrs("--train-samples 32 --lr-warmup-fraction 0.5", r);
  INFO(r.out << r.err);
  REQUIRE(r.exitCode == 0);
  CHECK(r.err.empty());
  CHECK(r.out.find("lr 0.001 -> 0.0001 (cosine, warmup 2), 4 steps\n") != std::string::npos);
  REQUIRE(lrs.size() == 4);
  CHECK(lrs[0] == Approx(0.0005));   // warmup: 1/2 of the peak
  CHECK(lrs[1] == Approx(0.001));    // the peak at the warmup's end
  CHECK(lrs[2] == Approx(0.00055));  // half way down the cosine to min-lr
  CHECK(lrs[3] == Approx(0.0001));

  // The fraction is of --lr-decay-iters where one is given (Megatron-LM's lr_decay_steps), not of --train-iters.
  const std::vector<double> ofDecay = stepLrs("--train-iters 3 --lr-decay-iters 8 --lr-warmup-fraction 0.25", r);
  REQUIRE(r.exitCode == 0);
  CHECK(r.out.find("(cosine, warmup 2), 3 steps\n") != std::string::npos);
  REQUIRE(ofDecay.size() == 3);
  CHECK(ofDecay[0] == Approx(0.0005));

  // Megatron-LM asserts lr_warmup_iters == 0 beside the fraction, by value: an explicit 0 is no conflict.
  const std::vector<double> zero = stepLrs("--train-samples 32 --lr-warmup-iters 0 --lr-warmup-fraction 0.5", r);
  INFO(r.err);
  REQUIRE(r.exitCode == 0);
  CHECK(zero == lrs);
}

TEST_CASE("tpc run: --lr-decay-samples and --lr-warmup-samples are steps of the global batch, with a warning when not "
          "whole", "[run][cli][megatron]") {
  test::CommandResult r;
  // 24 samples: 3 decay steps; 12 samples: 1.5 warmup steps, to the nearest, 2.
  const std::vector<double> lrs = stepLrs("--train-iters 4 --lr-decay-samples 24 --lr-warmup-samples 12", r);
  INFO(r.out << r.err);
  REQUIRE(r.exitCode == 0);
  CHECK(r.err == "tpc run: warning: --lr-warmup-samples 12 is not a multiple of the global batch of 8 sequences: 2 steps, "
                 "the nearest (Megatron-LM's schedule counts samples, tpc's whole steps)\n");
  CHECK(r.out.find("(cosine, warmup 2), 4 steps\n") != std::string::npos);
  REQUIRE(lrs.size() == 4);
  CHECK(lrs[1] == Approx(0.001));
  CHECK(lrs[2] == Approx(0.0001));  // the decay ends at step 3
  CHECK(lrs[3] == Approx(0.0001));

  // --train-samples rounds down, as Megatron-LM's train_samples // global_batch_size, and says so.
  auto down = test::runTiny("--train-samples 20 --eval-interval 0");
  CHECK(down.exitCode == 0);
  CHECK(down.err == "tpc run: warning: --train-samples 20 is not a multiple of the global batch of 8 sequences: 2 steps "
                    "(16 samples), as Megatron-LM rounds down\n");
  // (tiny's model file warms up over 20 steps: the header says the lr of so short a run never peaks.)
  CHECK(down.out.find("(cosine, warmup 20), 2 steps; the warmup is longer than the run: the lr rises to ") !=
        std::string::npos);

  // A fraction of the decay that is not whole steps goes to the nearest, and says so.
  auto fraction = test::runTiny("--train-iters 3 --lr-warmup-fraction 0.5 --eval-interval 0");
  CHECK(fraction.exitCode == 0);
  CHECK(fraction.err == "tpc run: warning: --lr-warmup-fraction 0.5 of 3 decay steps is 1.5 steps: a warmup of 2, the "
                        "nearest (tpc's schedule counts whole steps)\n");
}

TEST_CASE("tpc run: --pipeline-model-parallel-size 1 and --distributed-backend nccl are accepted and change nothing",
          "[run][cli][megatron]") {
  auto plain = test::runTiny("--train-iters 2 --eval-interval 0");
  auto megatron = test::runTiny("--train-iters 2 --eval-interval 0 --pipeline-model-parallel-size 1 "
                                "--distributed-backend nccl");
  auto equals = test::runTiny("--train-iters 2 --eval-interval 0 --pipeline-model-parallel-size=1");
  INFO(megatron.err);
  REQUIRE(plain.exitCode == 0);
  CHECK(megatron.exitCode == 0);
  CHECK(megatron.err.empty());
  CHECK(equals.exitCode == 0);
  auto losses = [](const std::string& out) {
    std::string s;
    for (size_t p = out.find("| loss "); p != std::string::npos; p = out.find("| loss ", p + 1)) s += out.substr(p, 14);
    return s;
  };
  CHECK(!losses(plain.out).empty());
  CHECK(losses(megatron.out) == losses(plain.out));
  CHECK(losses(equals.out) == losses(plain.out));
}

TEST_CASE("tpc run: Megatron-LM's schedule and parallelism flags that cannot be honoured are one error",
          "[run][cli][megatron]") {
  struct Case {
    std::string args, expected;
  };
  const Case cases[] = {
      // Megatron-LM asserts these pairs too.
      {"--lr-warmup-fraction 0.1 --lr-warmup-iters 5",
       "--lr-warmup-fraction and --lr-warmup-iters exclude each other; give one"},
      {"--lr-warmup-fraction 0.1 --lr-warmup-samples 40",
       "--lr-warmup-fraction and --lr-warmup-samples exclude each other; give one"},
      {"--train-samples 80 --train-iters 10", "--train-samples and --train-iters exclude each other; give one"},
      {"--lr-decay-samples 80 --lr-decay-iters 10", "--lr-decay-samples and --lr-decay-iters exclude each other; give one"},
      {"--lr-warmup-samples 80 --lr-warmup-iters 10",
       "--lr-warmup-samples and --lr-warmup-iters exclude each other; give one"},
      {"--lr-warmup-fraction 1.5", "--lr-warmup-fraction=1.5 must be in [0, 1] (a fraction of the decay steps)"},
      {"--lr-warmup-fraction abc", "--lr-warmup-fraction=abc is not a number"},
      // A warmup of all the decay steps leaves none to decay over (Megatron-LM asserts warmup < decay).
      {"--lr-warmup-fraction 1 --train-iters 10",
       "--lr-warmup-fraction 1 (10 steps) must be less than --train-iters 10 (the lr decays over the steps after the "
       "warmup; or give --lr-decay-iters)"},
      {"--lr-warmup-samples 80 --train-samples 80",
       "--lr-warmup-samples 80 (10 steps) must be less than --train-samples 80 (10 steps) (the lr decays over the steps "
       "after the warmup; or give --lr-decay-iters)"},
      {"--lr-warmup-iters 4 --lr-decay-samples 32", "--lr-warmup-iters 4 must be less than --lr-decay-samples 32 (4 steps)"},
      {"--train-samples 4", "--train-samples 4 is less than the global batch of 8 sequences: no step to train"},
      {"--lr-decay-samples 3", "--lr-decay-samples 3 is less than half the global batch of 8 sequences: no step to decay over"},
      {"--train-samples 0", "--train-samples=0 must be >= 1"},
      {"--pipeline-model-parallel-size 4 --tp 2",
       "--pipeline-model-parallel-size 4: tpc has no pipeline parallelism; spread the same 8 GPUs (tp 2 x pp 4 x dp 1) "
       "over --tp and --dp instead, with tp x dp = 8: e.g. --tp 2 --dp 4, or --tp 8"},
      {"--pipeline-model-parallel-size=2 --dp 2",
       "--pipeline-model-parallel-size 2: tpc has no pipeline parallelism; spread the same 4 GPUs (tp 1 x pp 2 x dp 2) "
       "over --tp and --dp instead, with tp x dp = 4: e.g. --dp 4, or --tp 2 --dp 2"},
      {"--pipeline-model-parallel-size 0", "--pipeline-model-parallel-size=0 is out of range [1, 16777216]"},
      {"--distributed-backend gloo",
       "--distributed-backend gloo: tpc has no gloo; its CPU ranks talk over MPI (mpirun -np N tpc run MODEL.fb --backend "
       "cpu ...), its GPU ranks over NCCL; drop the flag (and give --backend cpu for ranks on the CPU)"},
      {"--distributed-backend mpi",
       "--distributed-backend mpi: expected nccl, what tpc's GPU ranks use (its CPU ranks use MPI); drop the flag"},
  };
  for (const Case& c : cases) {
    auto r = test::runCommand(test::tpcBinary() + " run " + tiny() + " " + c.args);
    INFO("tpc run M " << c.args << "\nstderr: " << r.err);
    CHECK(r.exitCode == 1);
    CHECK(r.out.empty());
    CHECK(r.err == "tpc run: error: " + c.expected + "\n");
  }
}

}  // namespace tpc

namespace tpc {

// A constant schedule's header names no decay target (it said "lr 0.001 -> 0.0001" while the lr stayed 0.001).
TEST_CASE("tpc run: --lr-decay-style constant holds the lr after the warmup, and the header says so", "[run][cli][megatron]") {
  test::CommandResult r;
  const std::vector<double> lrs = stepLrs("--train-iters 4 --lr-warmup-iters 1 --lr-decay-style constant", r);
  INFO(r.out << r.err);
  REQUIRE(r.exitCode == 0);
  CHECK(r.out.find("  lr 0.001 (constant, warmup 1), 4 steps\n") != std::string::npos);
  REQUIRE(lrs.size() == 4);
  for (double lr : lrs) CHECK(lr == Approx(0.001));
}

}  // namespace tpc
