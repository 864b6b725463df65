// `tpc dump`'s flag combinations: the ones it cannot honour are one error naming both flags (--format dot with a
// text report, --passes with a flag only the standard pipeline reads, --rank before partition); --summary with
// --memory prints both; the dot form shows the fusion groups; --sp at tp 1 adds nothing to the pipeline.
#include <regex>
#include <set>
#include <vector>

#include <catch2/catch.hpp>

#include "test_support.h"

namespace tpc {
namespace {

std::string dump() { return test::tpcBinary() + " dump " + test::binaryPath("models/tiny.fb"); }

// One error line, nothing on stdout, exit 1.
void checkRefused(const test::CommandResult& r, const std::string& expected) {
  INFO(r.out << r.err);
  CHECK(r.exitCode == 1);
  CHECK(r.out.empty());
  CHECK(r.err == "tpc dump: error: " + expected + "\n");
}

// What `dot` needs of our output: balanced braces outside quoted strings, every edge's and cluster member's node
// declared with its attributes. Returns what is wrong, "" when nothing.
std::string dotProblems(const std::string& dot) {
  std::string bare;  // the text with quoted strings emptied
  bool quoted = false;
  for (size_t i = 0; i < dot.size(); ++i) {
    if (quoted && dot[i] == '\\') ++i;
    else if (dot[i] == '"') quoted = !quoted, bare += '"';
    else if (!quoted) bare += dot[i];
  }
  if (quoted) return "an unterminated string";
  int depth = 0;
  for (char ch : bare) {
    depth += ch == '{' ? 1 : ch == '}' ? -1 : 0;
    if (depth < 0) return "a '}' without its '{'";
  }
  if (depth != 0) return "unbalanced braces";
  std::set<std::string> declared;
  std::smatch m;
  const std::regex decl(R"(^\s*(\w+) \[)"), edge(R"(^\s*(\w+) -> (\w+)\b)"), member(R"(^\s*((\w+;\s*)+)$)"), word(R"(\w+)");
  size_t start = 0;
  std::vector<std::string> used;
  for (size_t end; (end = bare.find('\n', start)) != std::string::npos; start = end + 1) {
    std::string line = bare.substr(start, end - start);
    if (std::regex_search(line, m, edge)) used.insert(used.end(), {m[1], m[2]});
    else if (std::regex_search(line, m, decl)) declared.insert(m[1]);
    else if (std::regex_match(line, m, member)) {
      std::string ids = m[1];
      for (std::sregex_iterator it(ids.begin(), ids.end(), word), e; it != e; ++it) used.push_back(it->str());
    }
  }
  for (const std::string& id : used)
    if (!declared.count(id)) return "node " + id + " is used but not declared";
  return "";
}

TEST_CASE("tpc dump --summary --memory prints both, the summary first", "[dump][cli]") {
  auto r = test::runCommand(dump() + " --summary --memory");
  INFO(r.err);
  REQUIRE(r.exitCode == 0);
  CHECK_THAT(r.out, Catch::StartsWith("collectives per step (no mesh):\n  none\n"));
  CHECK_THAT(r.out, Catch::Contains("memory of one rank's step after fuse"));
  CHECK(r.out.find("collectives per step") < r.out.find("memory of one rank's step"));
}

TEST_CASE("tpc dump --format dot with a text report is refused, naming both flags", "[dump][cli][errors]") {
  for (const char* text : {"summary", "memory", "print-pipeline"})
    checkRefused(test::runCommand(dump() + " --format dot --" + text),
                 std::string("--format dot and --") + text + " exclude each other: --" + text +
                     " prints text, not a graph; drop one");
  CHECK(test::runCommand(dump() + " --format text --summary").exitCode == 0);
}

TEST_CASE("tpc dump --passes with a flag only the standard pipeline reads is refused", "[dump][cli][errors]") {
  const std::string passes = " --passes=autodiff,dce";
  struct Case {
    std::string args, expected;
  };
  const Case cases[] = {
      {"--rank 1", "--rank 1 is ignored with --passes; give the rank in the list, partition(rank=1), or drop --passes"},
      {"--no-fuse", "--no-fuse is ignored with --passes (it edits the standard pipeline); leave the pass out of --passes, or drop --passes"},
      {"--no-fuse-classifier", "--no-fuse-classifier is ignored with --passes (it edits the standard pipeline); leave the "
                               "pass out of --passes, or drop --passes"},
      {"--bf16", "--bf16 is ignored with --passes; put mixed-precision(dtype=bf16) before autodiff in --passes, or drop --passes"},
      {"--precision fp16", "--precision fp16 is ignored with --passes; put mixed-precision(dtype=f16) before autodiff in "
                           "--passes and loss-scale=true in autodiff's options, or drop --passes"},
      {"--recompute full", "--recompute full is ignored with --passes; put recompute(mode=full) after autodiff in --passes, or drop --passes"},
      {"--tp 2 --sp", "--sp is ignored with --passes; put sequence-parallel after the tp policy in --passes, or drop --passes"},
      {"--tp 2 --sharding-policy megatron-tp", "--sharding-policy=megatron-tp is ignored with --passes; put "
                                               "megatron-tp(tp=N) in --passes, or drop --passes"},
      {"--tp 2", "--tp 2 with --passes only pads the vocabulary, it does not shard; put the policy in --passes "
                 "(megatron-tp(tp=2) ... partition(rank=R)), or drop --passes"},
      {"--dp 2 --micro-batch-size 4", "--dp 2 with --passes only multiplies the batch, it does not shard; put "
                                      "data-parallel(dp=2) after autodiff in --passes, or drop --passes"},
  };
  for (const Case& c : cases) {
    INFO(c.args);
    checkRefused(test::runCommand(dump() + passes + " " + c.args), c.expected);
  }
  // What the list itself can use stays: the batch and sequence flags, fp32, and --tp/--dp that size the graph for
  // the list's own megatron-tp(tp=N) / data-parallel(dp=N).
  for (std::string ok : {" --micro-batch-size 4 --seq-length 32 --precision fp32 --recompute none",
                         " --tp 2 --sharding-policy megatron-tp --passes='megatron-tp(tp=2),autodiff,dce,partition(rank=1)'",
                         " --dp 2 --micro-batch-size 4 --passes='autodiff,data-parallel(dp=2),partition(rank=1)'"}) {
    auto r = test::runCommand(dump() + (ok.find("--passes") == std::string::npos ? passes : "") + ok);
    INFO(ok << "\n" << r.err);
    CHECK(r.exitCode == 0);
    CHECK_THAT(r.out, Catch::Contains("adamw_update("));
  }
}

TEST_CASE("tpc dump --passes with an optimizer flag: refused unless the list gives its pass that value", "[dump][cli][errors]") {
  // The standard pipeline reads each of them into autodiff's or data-parallel's options.
  auto standard = test::runCommand(dump() + " --print-pipeline --clip-grad 0.5 --weight-decay 0.01 --adam-beta1 0.8 "
                                   "--adam-beta2 0.99 --adam-eps 1e-6 --micro-batch-size 2 --global-batch-size 8");
  INFO(standard.err);
  REQUIRE(standard.exitCode == 0);
  CHECK_THAT(standard.out, Catch::Contains("autodiff(loss=loss, accum=4, clip-grad=0.5, beta1=0.8, beta2=0.99, eps=1e-06, "
                                           "weight-decay=0.01)"));
  auto zero1 = test::runCommand(dump() + " --print-pipeline --dp 2 --micro-batch-size 2 --use-distributed-optimizer");
  CHECK_THAT(zero1.out, Catch::Contains("data-parallel(dp=2, zero1=true)"));

  // A list that does not give them (or gives another value): refused, as one error with no warning before it.
  const std::string fix = " in autodiff's options in --passes, or drop --passes";
  struct Case {
    std::string args, expected;
  };
  const Case cases[] = {
      {"--clip-grad 0.5", "--clip-grad 0.5 is ignored with --passes; put clip-grad=0.5" + fix},
      {"--weight-decay 0.01", "--weight-decay 0.01 is ignored with --passes; put weight-decay=0.01" + fix},
      {"--adam-beta1 0.8", "--adam-beta1 0.8 is ignored with --passes; put beta1=0.8" + fix},
      {"--adam-beta2 0.99", "--adam-beta2 0.99 is ignored with --passes; put beta2=0.99" + fix},
      {"--adam-eps 1e-6", "--adam-eps 1e-6 is ignored with --passes; put eps=1e-6" + fix},
      {"--clip-grad 0.5 --passes='autodiff(clip-grad=1.0),dce'", "--clip-grad 0.5 is ignored with --passes; put clip-grad=0.5" + fix},
      {"--micro-batch-size 2 --global-batch-size 8", "--global-batch-size 8 is ignored with --passes (it makes 4 micro-batches "
                                                     "per step); put accum=4" + fix},
      {"--micro-batch-size 2 --global-batch-size 8 --passes='autodiff(accum=2),dce'",
       "--global-batch-size 8 is ignored with --passes (it makes 4 micro-batches per step); put accum=4" + fix},
      // At dp 1 this was a warning that it does nothing, then the error: the error alone now.
      {"--use-distributed-optimizer", "--use-distributed-optimizer is ignored with --passes; put zero1=true in "
                                      "data-parallel's options in --passes (data-parallel(dp=N, zero1=true) after autodiff), "
                                      "or drop --passes"},
      {"--dp 2 --micro-batch-size 2 --use-distributed-optimizer --passes='autodiff,data-parallel(dp=2),partition(rank=1)'",
       "--use-distributed-optimizer is ignored with --passes; put zero1=true in data-parallel's options in --passes "
       "(data-parallel(dp=2, zero1=true) after autodiff), or drop --passes"},
      {"--sp", "--sp is ignored with --passes; put sequence-parallel after the tp policy in --passes, or drop --passes"},
  };
  for (const Case& c : cases) {
    INFO(c.args);
    checkRefused(test::runCommand(dump() + (c.args.find("--passes") == std::string::npos ? " --passes=autodiff,dce " : " ") +
                                  c.args),
                 c.expected);
  }

  // A list that gives its pass the flag's value (written any way that reads as it): the value is in effect, and the
  // flags change nothing else.
  const std::string list = " --passes='autodiff(clip-grad=0.50, beta1=.8, beta2=0.99, eps=0.000001, weight-decay=1e-2),dce'";
  auto plain = test::runCommand(dump() + list);
  auto flagged = test::runCommand(dump() + list + " --clip-grad 0.5 --weight-decay 0.01 --adam-beta1 0.8 --adam-beta2 0.99 "
                                  "--adam-eps 1e-6");
  INFO(flagged.err);
  REQUIRE(plain.exitCode == 0);
  CHECK(flagged.exitCode == 0);
  CHECK(flagged.err.empty());
  CHECK(flagged.out == plain.out);
  CHECK_THAT(flagged.out, Catch::Contains("clip_scale(%grad_norm) {max_norm=0.5}"));
  CHECK_THAT(flagged.out, Catch::Contains("{beta1=0.8, beta2=0.99, eps=1e-06, weight_decay=0.01}"));
  auto accum = test::runCommand(dump() + " --micro-batch-size 2 --global-batch-size 8 --passes='autodiff(accum=4),dce'");
  INFO(accum.err);
  CHECK(accum.exitCode == 0);
  CHECK_THAT(accum.out, Catch::StartsWith("graph @gpt(%tokens: i32[4,2,64]"));
  auto sharded = test::runCommand(dump() + " --dp 2 --micro-batch-size 2 --use-distributed-optimizer --summary "
                                  "--passes='autodiff,data-parallel(dp=2, zero1=true),partition(rank=1)'");
  INFO(sharded.err);
  CHECK(sharded.exitCode == 0);
  CHECK_THAT(sharded.out, Catch::Contains("optimizer state on this rank: "));
}

TEST_CASE("tpc dump --rank before partition is refused: the rank's program exists from partition on", "[dump][cli][errors]") {
  checkRefused(test::runCommand(dump() + " --tp 2 --rank 1 --after=autodiff"),
               "--rank 1 has no effect at --after=autodiff: the rank's program exists from partition on; give "
               "--after=partition or a later pass, or drop --rank");
  for (const char* after : {"partition", "fuse"}) {
    auto r = test::runCommand(dump() + " --tp 2 --rank 1 --after=" + after);
    INFO(after << "\n" << r.err);
    CHECK(r.exitCode == 0);
    CHECK_THAT(r.out, Catch::Contains("all_reduce"));
  }
  CHECK(test::runCommand(dump() + " --tp 2 --rank 1 --summary").exitCode == 0);  // the whole pipeline
}

TEST_CASE("tpc dump --format dot shows the fusion groups and stays valid dot", "[dump][cli][fusion]") {
  auto fused = test::runCommand(dump() + " --format dot --after=fuse");
  INFO(fused.err);
  REQUIRE(fused.exitCode == 0);
  CHECK_THAT(fused.out, Catch::StartsWith("digraph"));
  CHECK_THAT(fused.out, Catch::Contains("subgraph cluster_fusion_0 {"));
  CHECK_THAT(fused.out, Catch::Contains("\\nfusion_group=0\""));
  CHECK(dotProblems(fused.out) == "");
  auto plain = test::runCommand(dump() + " --format dot --tp 2 --after=partition");
  REQUIRE(plain.exitCode == 0);
  CHECK(plain.out.find("fusion_group") == std::string::npos);  // before fuse there are none
  CHECK(dotProblems(plain.out) == "");
  CHECK(dotProblems("digraph g {\n  a0 -> n0;\n}\n") == "node a0 is used but not declared");  // the checker checks
  CHECK(dotProblems("digraph g {\n  n0 [label=\"}\"];\n") == "unbalanced braces");
  // Graphviz itself, where it is installed.
  if (test::runCommand("command -v dot").exitCode == 0) {
    test::TempDir dir;
    std::string file = dir / "fused.dot";
    test::writeFile(file, fused.out);
    auto dot = test::runCommand("dot -Tcanon " + file);
    INFO(dot.err);
    CHECK(dot.exitCode == 0);
  }
}

TEST_CASE("tpc dump --sp with tp 1: the pipeline gains nothing, as its warning says", "[dump][cli]") {
  auto plain = test::runCommand(dump() + " --print-pipeline");
  auto sp = test::runCommand(dump() + " --sp --print-pipeline");
  REQUIRE(sp.exitCode == 0);
  CHECK(sp.out == plain.out);
  CHECK(sp.err == "tpc dump: warning: --sp does nothing with tp 1 (it splits the sequence over the tp ranks); add --tp N\n");
  auto summary = test::runCommand(dump() + " --sp --summary");
  REQUIRE(summary.exitCode == 0);
  CHECK(summary.out == "collectives per step (no mesh):\n  none\n  total: 0 bytes\n");
  // With tp 2 --sp still splits the sequence.
  CHECK_THAT(test::runCommand(dump() + " --tp 2 --sp --print-pipeline").out, Catch::Contains("sequence-parallel"));
}

}  // namespace
}  // namespace tpc
