// Evaluation during training (issue 8): --eval-interval/--eval-iters log validation loss and perplexity,
// a test-split loss after the last step, the numbers do not depend on --tp, and `inference` drops dropout.
#include <catch2/catch.hpp>

#include <cmath>
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
