// Evaluation during training (issue 8): --eval-interval/--eval-iters log validation loss and perplexity,
// a test-split loss after the last step, the numbers do not depend on --tp, and `inference` drops dropout.
#include <catch2/catch.hpp>

#include <cmath>
#include <filesystem>
#include <sstream>

#include "ir/parser.h"
#include "passes/builtin_passes.h"
#include "test_support.h"

namespace tpc {

TEST_CASE("eval: validation loss and perplexity every N steps, test loss at the end, equal under tp", "[eval][cli]") {
  test::TempDir dir;
  std::vector<std::vector<double>> valid;
  for (const char* tp : {"1", "2"}) {
    std::string log = dir / (std::string("tp") + tp + ".jsonl");
    auto r = test::runCommand(test::tpcBinary() + " run " + test::binaryPath("models/tiny.fb") +
                              " --threads 2 --train-iters 4 --eval-interval 2 --eval-iters 2 --split 90,5,5 --tp " + tp +
                              " --log-jsonl " + log);
    INFO(r.out << r.err);
    REQUIRE(r.exitCode == 0);
    CHECK(r.out.find("eval at step 2 | valid loss ") != std::string::npos);
    CHECK(r.out.find("test loss ") != std::string::npos);
    std::string jsonl = test::readFile(log);
    auto v = test::jsonlField(jsonl, "valid_loss"), ppl = test::jsonlField(jsonl, "valid_ppl");
    auto testLoss = test::jsonlField(jsonl, "test_loss");
    REQUIRE(v.size() == 2);  // steps 2 and 4
    REQUIRE(ppl.size() == 2);
    CHECK(std::abs(ppl[1] - std::exp(v[1])) <= 1e-6 * ppl[1]);
    CHECK(v[1] < v[0]);  // training helps on held-out text
    CHECK(testLoss.size() == 1);
    valid.push_back(v);
  }
  for (size_t i = 0; i < valid[0].size(); ++i) CHECK(std::abs(valid[1][i] - valid[0][i]) <= 1e-5 * valid[0][i]);
  auto empty = test::runCommand(test::tpcBinary() + " run " + test::binaryPath("models/tiny.fb") +
                                " --train-iters 2 --eval-interval 1 --split 100,0,0");
  CHECK(empty.exitCode == 1);
  CHECK(empty.err.find("the validation split is empty") != std::string::npos);
}

TEST_CASE("eval: --eval-iters counts global batches, so the loss does not depend on the micro batch", "[eval][cli]") {
  test::TempDir dir;
  std::vector<double> valid;
  for (const char* layout : {"--micro-batch-size 8", "--micro-batch-size 2", "--micro-batch-size 2 --dp 2"}) {
    const std::string log = dir / "log.jsonl";
    auto r = test::runTiny(std::string(layout) + " --global-batch-size 8 --seq-length 32 --train-iters 2 --split 80,10,10 "
                           "--eval-interval 2 --eval-iters 1 --log-jsonl " + log);
    INFO(layout << ": " << r.out << r.err);
    REQUIRE(r.exitCode == 0);
    const auto v = test::jsonlField(test::readFile(log), "valid_loss");
    REQUIRE(v.size() == 1);
    valid.push_back(v[0]);
  }
  CHECK(std::abs(valid[1] - valid[0]) <= 1e-6 * valid[0]);  // one global batch of 8 sequences each time
  CHECK(std::abs(valid[2] - valid[0]) <= 1e-6 * valid[0]);
}

TEST_CASE("eval: the model file's eval_interval, eval_iters and save_interval are the flags' defaults", "[eval][cli]") {
  test::TempDir dir;
  const std::string model = dir / "m.json", noIters = dir / "no_iters.json";
  REQUIRE(test::runCommand(test::tpcBinary() + " new gpt --preset tiny -o " + model).exitCode == 0);
  std::string json = test::readFile(model);
  auto set = [](std::string text, const std::string& from, const std::string& to) {
    size_t at = text.find(from);
    REQUIRE(at != std::string::npos);
    return text.replace(at, from.size(), to);
  };
  json = set(set(set(json, "\"eval_interval\": 50", "\"eval_interval\": 2"), "\"eval_iters\": 10", "\"eval_iters\": 1"),
             "\"save_interval\": 0", "\"save_interval\": 2");
  test::writeFile(model, json);
  test::writeFile(noIters, set(json, "\"eval_iters\": 1", "\"eval_iters\": 0"));
  const std::string run = test::tpcBinary() + " run ";

  auto r = test::runCommand(run + model + " --train-iters 4 --split 90,5,5 --save " + (dir / "ck"));
  INFO(r.out << r.err);
  REQUIRE(r.exitCode == 0);
  CHECK(r.out.find("  eval: every 2 steps, 1 batches of the validation split") != std::string::npos);
  CHECK(r.out.find("eval at step 2 | valid loss ") != std::string::npos);
  CHECK(r.out.find("eval at step 4 | valid loss ") != std::string::npos);
  // As in Megatron-LM: a step's line, then its evaluation.
  CHECK(r.out.find("step      4/4 | loss ") < r.out.find("eval at step 4 | valid loss "));
  CHECK(r.out.find("(1 batches of the test split)") != std::string::npos);
  CHECK(std::filesystem::exists(dir / "ck/iter_0000002"));  // save_interval 2
  CHECK(std::filesystem::exists(dir / "ck/iter_0000004"));

  // The flags win; without --save the file's save_interval is not an error.
  auto off = test::runCommand(run + model + " --train-iters 4 --split 90,5,5 --eval-interval 0");
  CHECK(off.exitCode == 0);
  CHECK(off.out.find("eval") == std::string::npos);
  auto flags = test::runCommand(run + model + " --train-iters 3 --split 90,5,5 --eval-interval 3 --eval-iters 2");
  CHECK(flags.exitCode == 0);
  CHECK(flags.out.find("  eval: every 3 steps, 2 batches") != std::string::npos);
  CHECK(flags.out.find("eval at step 2 ") == std::string::npos);

  // No validation split: the file's eval_interval is not applied (a note); --eval-interval is an error (above).
  auto empty = test::runCommand(run + model + " --train-iters 2 --split 100,0,0");
  CHECK(empty.exitCode == 0);
  CHECK(empty.out.find("no evaluation: the validation split of --split=100,0,0 is empty (the model file's eval_interval 2 "
                       "is not applied)") != std::string::npos);

  // The file's eval_iters 0 is no evaluation, as in Megatron-LM; asking for one with --eval-interval is an error.
  auto none = test::runCommand(run + noIters + " --train-iters 2");
  CHECK(none.exitCode == 0);
  CHECK(none.out.find("no evaluation: the model file's eval_iters is 0 (its eval_interval 2 is not applied)") != std::string::npos);
  CHECK(none.out.find("eval at") == std::string::npos);
  auto asked = test::runCommand(run + noIters + " --train-iters 2 --eval-interval 1");
  CHECK(asked.exitCode == 1);
  CHECK(asked.err == noIters + ": error: config.eval_iters=0 leaves the evaluations of --eval-interval 1 no batches; give "
                               "--eval-iters N\n");
  auto iters = test::runCommand(run + noIters + " --train-iters 2 --eval-iters 1");
  CHECK(iters.exitCode == 0);
  CHECK(iters.out.find("eval at step 2 | valid loss ") != std::string::npos);
}

TEST_CASE("inference pass: dropout becomes the identity, attention drops nothing", "[eval][passes]") {
  auto g = parseGraph(R"(graph @f(%x: f32[2,2,4,8]) {
  %y = dropout(%x) {p=0.1, key=3} : f32[2,2,4,8]
  %o, %lse = attention(%y, %y, %y) {dropout=0.1, key=4} : f32[2,2,4,8], f32[2,2,4]
  return o=%o
}
)",
                      "t.tir");
  REQUIRE(g.ok());
  REQUIRE(createInferencePass()->run(**g).ok());
  int dropouts = 0;
  for (Node* n : (*g)->nodes()) {
    if (n->op() == OpKind::Dropout) ++dropouts;
    if (n->op() == OpKind::Attention) {
      CHECK(n->getFloat("dropout") == 0.0);
      CHECK(n->operand(0) == (*g)->inputs()[0]);
    }
  }
  CHECK(dropouts == 0);
}

}  // namespace tpc
