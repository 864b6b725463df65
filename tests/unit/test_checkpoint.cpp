// Checkpoints (issue 8): safetensors round trip and its reader's checks; `tpc run --save/--load`: a resumed run
// is bit-identical to an uninterrupted one, a tp 4 checkpoint loads at tp 1 and tp 2, a save killed halfway
// leaves the previous checkpoint loadable, and bad checkpoints give one error naming the tensor or file.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <sstream>

#include "runtime/checkpoint.h"
#include "runtime/safetensors.h"
#include "test_support.h"

namespace tpc {
namespace {

std::string tiny() { return test::binaryPath("models/tiny.fb"); }

}  // namespace

TEST_CASE("safetensors: round trip, and the reader refuses what a crafted file lies about", "[checkpoint]") {
  SafetensorsFile f;
  HostTensor a(TensorType(DType::f32, {2, 3})), b(TensorType(DType::i32, {4}));
  for (int i = 0; i < 6; ++i) a.data<float>()[i] = 0.5f * i;
  for (int i = 0; i < 4; ++i) b.data<int32_t>()[i] = -i;
  f.tensors = {{"a.weight", a}, {"b", b}};
  f.metadata["format"] = "pt";
  auto bytes = serializeSafetensors(f);
  REQUIRE(bytes.ok());
  CHECK((bytes->size() - 40) % 8 == 0);  // 40 data bytes, after a header padded to keep them 8-byte aligned
  auto back = parseSafetensors("x.safetensors", *bytes);
  REQUIRE(back.ok());
  REQUIRE(back->tensors.size() == 2);
  CHECK(back->tensors[0].first == "a.weight");
  CHECK(back->find("a.weight")->type().str() == "f32[2,3]");
  CHECK(back->find("a.weight")->data<float>()[5] == 2.5f);
  CHECK(back->find("b")->data<int32_t>()[3] == -3);
  CHECK(back->metadata.at("format") == "pt");

  auto mutate = [&](const std::string& from, const std::string& to) {
    std::string s = *bytes;
    auto k = s.find(from);
    REQUIRE(k != std::string::npos);
    s.replace(k, from.size(), to);
    return parseSafetensors("x.safetensors", s);
  };
  auto truncated = parseSafetensors("x.safetensors", bytes->substr(0, bytes->size() - 4));
  REQUIRE(!truncated.ok());
  CHECK(truncated.error().find("x.safetensors: error: not a valid safetensors file: tensor 'b'") == 0);
  std::string hugeHeader = *bytes;
  hugeHeader[7] = 0x7f;
  CHECK(parseSafetensors("x.safetensors", hugeHeader).error().find("header length") != std::string::npos);
  CHECK(mutate("\"F32\"", "\"F99\"").error().find("unsupported dtype F99") != std::string::npos);
  CHECK(mutate("[2,3]", "[3,3]").error().find("do not hold its shape") != std::string::npos);
  CHECK(!parseSafetensors("x.safetensors", "abc").ok());
  // From a file, each tensor is read into its own storage after the checks: the same errors, the same tensors.
  test::TempDir dir;
  const std::string path = dir / "x.safetensors";
  for (const std::string& cut : {bytes->substr(0, bytes->size() - 4), hugeHeader, std::string("abc")}) {
    test::writeFile(path, cut);
    auto fromFile = readSafetensors(path);
    REQUIRE_FALSE(fromFile.ok());
    CHECK(fromFile.error() == parseSafetensors(path, cut).error());
  }
  test::writeFile(path, *bytes);
  auto whole = readSafetensors(path);
  REQUIRE(whole.ok());
  REQUIRE(whole->tensors.size() == back->tensors.size());
  for (size_t i = 0; i < whole->tensors.size(); ++i) {
    CHECK(whole->tensors[i].first == back->tensors[i].first);
    CHECK(whole->tensors[i].second.type() == back->tensors[i].second.type());
    CHECK(std::equal(whole->tensors[i].second.raw(), whole->tensors[i].second.raw() + whole->tensors[i].second.bytes(),
                     back->tensors[i].second.raw()));
  }
}

TEST_CASE("checkpoint: a resumed run is bit-identical to an uninterrupted one", "[checkpoint][run][cli]") {
  test::TempDir dir;
  auto full = test::runTiny("--train-iters 6 --log-jsonl " + dir.path.string() + "/full.jsonl");
  REQUIRE(full.exitCode == 0);
  auto first = test::runTiny("--train-iters 3 --save " + dir.path.string() + "/ck --log-jsonl " + dir.path.string() + "/part.jsonl");
  REQUIRE(first.exitCode == 0);
  CHECK(std::filesystem::exists(dir.path.string() + "/ck/iter_0000003/model.safetensors"));
  CHECK(test::readFile(dir.path.string() + "/ck/latest_checkpointed_iteration.txt") == "3\n");
  auto second = test::runTiny("--train-iters 6 --load " + dir.path.string() + "/ck --log-jsonl " + dir.path.string() + "/part.jsonl");
  REQUIRE(second.exitCode == 0);
  CHECK(second.out.find("resuming from " + dir.path.string() + "/ck/iter_0000003 (iteration 3)") != std::string::npos);
  auto a = test::jsonlField(test::readFile(dir.path.string() + "/full.jsonl"), "loss");
  auto b = test::jsonlField(test::readFile(dir.path.string() + "/part.jsonl"), "loss");
  REQUIRE(a.size() == 6);
  CHECK(a == b);  // the JSONL keeps 9 digits: bit-identical floats print identically
}

// A save between steps: the trainer has already read the next step's batch (it reads it while the backend
// runs the step), and the checkpoint's data position must leave that batch out.
TEST_CASE("checkpoint: a run resumed from a mid-run save is bit-identical to an uninterrupted one", "[checkpoint][run][cli]") {
  test::TempDir dir;
  const std::string d = dir.path.string();
  auto full = test::runTiny("--train-iters 6 --save-interval 2 --save " + d + "/ck --log-jsonl " + d + "/full.jsonl");
  REQUIRE(full.exitCode == 0);
  // The console in order: each step's line, then its save (the line used to wait for the next step).
  for (const char* it : {"2", "4", "6"}) {
    INFO(full.out);
    size_t line = full.out.find(std::string("step      ") + it + "/6 |");
    size_t saved = full.out.find("saved checkpoint " + d + "/ck iteration " + it + " (5.2 MiB in ");
    REQUIRE(line != std::string::npos);
    REQUIRE(saved != std::string::npos);
    CHECK(line < saved);
  }
  auto resumed = test::runTiny("--train-iters 6 --load " + d + "/ck/iter_0000002 --log-jsonl " + d + "/part.jsonl");
  REQUIRE(resumed.exitCode == 0);
  auto a = test::jsonlField(test::readFile(d + "/full.jsonl"), "loss");
  auto b = test::jsonlField(test::readFile(d + "/part.jsonl"), "loss");
  REQUIRE(a.size() == 6);
  REQUIRE(b.size() == 4);  // steps 3-6
  CHECK(std::vector<double>(a.begin() + 2, a.end()) == b);
}

TEST_CASE("checkpoint: saved at tp 4, loaded at tp 1 and tp 2, the next step's loss agrees", "[checkpoint][sharding]") {
  test::TempDir dir;
  REQUIRE(test::runTiny("--tp 4 --train-iters 3 --save-interval 3 --keep 1 --save " + dir.path.string() + "/ck").exitCode == 0);
  std::vector<double> next;
  for (const char* tp : {"4", "2", "1"}) {
    std::string log = dir.path.string() + "/tp" + tp + ".jsonl";
    auto r = test::runTiny(std::string("--tp ") + tp + " --train-iters 4 --load " + dir.path.string() + "/ck --log-jsonl " + log);
    REQUIRE(r.exitCode == 0);
    auto l = test::jsonlField(test::readFile(log), "loss");
    REQUIRE(l.size() == 1);
    next.push_back(l[0]);
  }
  WARN("next-step loss after loading a tp 4 checkpoint: tp 4 " << next[0] << ", tp 2 " << next[1] << ", tp 1 " << next[2]);
  // tp changes only the order of fp32 sums (the equivalence tests' bound).
  CHECK(std::abs(next[1] - next[0]) <= 1e-5 * next[0]);
  CHECK(std::abs(next[2] - next[0]) <= 1e-5 * next[0]);
}

TEST_CASE("checkpoint: --keep never removes the checkpoint just written, even below a longer run's", "[checkpoint][cli]") {
  test::TempDir dir;
  const std::string ck = dir.path.string() + "/ck";
  REQUIRE(test::runTiny("--train-iters 4 --save-interval 2 --save " + ck).exitCode == 0);  // iter 2 and 4
  // Resumed from iter 2 and saved at 3 with keep 1: 3 stays although the earlier branch's 4 is newer by number.
  auto r = test::runTiny("--train-iters 3 --keep 1 --load " + ck + "/iter_0000002 --save " + ck);
  INFO(r.out << r.err);
  REQUIRE(r.exitCode == 0);
  CHECK(std::filesystem::exists(ck + "/iter_0000003/state.json"));
  CHECK(!std::filesystem::exists(ck + "/iter_0000004"));
  CHECK(!std::filesystem::exists(ck + "/iter_0000002"));
  CHECK(test::readFile(ck + "/latest_checkpointed_iteration.txt") == "3\n");
  // keep 2: this one and the newest other.
  REQUIRE(test::runTiny("--train-iters 6 --save-interval 2 --keep 2 --load " + ck + " --save " + ck).exitCode == 0);
  CHECK(std::filesystem::exists(ck + "/iter_0000006"));
  CHECK(std::filesystem::exists(ck + "/iter_0000004"));
  CHECK(!std::filesystem::exists(ck + "/iter_0000003"));
  // A longer earlier run's checkpoint (8) gives way to this run's previous one, not the other way round.
  const std::string ck2 = dir.path.string() + "/ck2";
  REQUIRE(test::runTiny("--train-iters 8 --save-interval 4 --save " + ck2).exitCode == 0);
  REQUIRE(test::runTiny("--train-iters 6 --save-interval 1 --keep 2 --load " + ck2 + "/iter_0000004 --save " + ck2).exitCode == 0);
  CHECK(std::filesystem::exists(ck2 + "/iter_0000006"));
  CHECK(std::filesystem::exists(ck2 + "/iter_0000005"));
  CHECK(!std::filesystem::exists(ck2 + "/iter_0000008"));
  CHECK(!std::filesystem::exists(ck2 + "/iter_0000004"));
}

TEST_CASE("checkpoint: a fresh run refuses a --save folder that holds another run's checkpoints", "[checkpoint][cli]") {
  test::TempDir dir;
  const std::string ck = dir.path.string() + "/ck";
  REQUIRE(test::runTiny("--train-iters 4 --save-interval 2 --save " + ck).exitCode == 0);
  const std::string before = test::readFile(ck + "/iter_0000002/model.safetensors");
  for (const std::string& extra : {std::string(), std::string(" --keep 1"), " --load " + dir.path.string() + "/other"}) {
    if (!extra.empty() && extra.find("other") != std::string::npos)  // a resume from elsewhere is not a resume of ck
      REQUIRE(test::runTiny("--train-iters 1 --save " + dir.path.string() + "/other").exitCode == 0);
    auto r = test::runTiny("--train-iters 2 --save " + ck + extra);
    INFO(extra << "\n" << r.out << r.err);
    CHECK(r.exitCode == 1);
    CHECK_THAT(r.err, Catch::Matchers::Contains("--save " + ck + ": error: already holds another run's checkpoints") &&
                          Catch::Matchers::Contains("resume that run with --load " + ck));
  }
  // Nothing was touched: the same files, the same latest iteration.
  CHECK(test::readFile(ck + "/latest_checkpointed_iteration.txt") == "4\n");
  CHECK(test::readFile(ck + "/iter_0000002/model.safetensors") == before);
  CHECK(std::filesystem::exists(ck + "/iter_0000004/state.json"));
  // A folder with only an iter_N directory (no latest file) is another run's too.
  const std::string ck3 = dir.path.string() + "/ck3";
  std::filesystem::create_directories(ck3 + "/iter_0000007");
  CHECK(test::runTiny("--train-iters 1 --save " + ck3).exitCode == 1);
}

TEST_CASE("checkpoint: --finetune never saves into the folder of the checkpoint it starts from", "[checkpoint][cli]") {
  test::TempDir dir;
  const std::string ck = dir.path.string() + "/ck";
  REQUIRE(test::runTiny("--train-iters 4 --save-interval 2 --save " + ck).exitCode == 0);
  const std::string before = test::readFile(ck + "/iter_0000004/model.safetensors");
  // The fine-tune's iter_0000004 would replace the base, and --keep 1 would delete iter_0000002 and iter_0000004.
  for (const std::string& load : {ck, ck + "/iter_0000004"})
    for (const char* keep : {"", " --keep 1"}) {
      auto r = test::runTiny("--train-iters 4 --finetune --load " + load + " --save " + ck + keep);
      INFO(load << keep << "\n" << r.out << r.err);
      CHECK(r.exitCode == 1);
      CHECK_THAT(r.err, Catch::Matchers::Contains("--save " + ck + ": error: holds the checkpoint --finetune starts from (" +
                                                  ck + "/iter_0000004); a fine-tune is a new run: save it to another folder"));
    }
  CHECK(test::readFile(ck + "/iter_0000004/model.safetensors") == before);
  CHECK(std::filesystem::exists(ck + "/iter_0000002/state.json"));
  // Into a folder of its own it runs, and says what it took.
  auto ok = test::runTiny("--train-iters 1 --finetune --load " + ck + " --save " + dir.path.string() + "/tuned");
  INFO(ok.err);
  CHECK(ok.exitCode == 0);
  CHECK_THAT(ok.out, Catch::Matchers::Contains("fine-tuning from " + ck +
                                               "/iter_0000004: its parameters (step, AdamW state and data order start anew)"));
}

TEST_CASE("checkpoint: a resume under another lr, schedule or window length says what changed", "[checkpoint][cli]") {
  test::TempDir dir;
  const std::string ck = dir.path.string() + "/ck";
  REQUIRE(test::runTiny("--train-iters 4 --save " + ck).exitCode == 0);
  CHECK_THAT(test::readFile(ck + "/iter_0000004/state.json"),
             Catch::Matchers::Contains("\"lr-decay-iters\": \"4\"") && Catch::Matchers::Contains("\"lr\": \"0.001\""));
  // The same settings (the decay's length kept at 4 by the flag): nothing to say.
  auto same = test::runTiny("--train-iters 6 --lr-decay-iters 4 --lr-warmup-iters 2 --load " + ck);
  INFO(same.err);
  CHECK(same.exitCode == 0);
  CHECK_THAT(same.err, Catch::Matchers::Contains("--lr-warmup-iters is 2; the checkpoint's run had 20"));
  CHECK(std::count(same.err.begin(), same.err.end(), '\n') == 1);
  const std::string at = "tpc run: warning: resuming " + ck + "/iter_0000004: ";
  auto changed = test::runTiny("--train-iters 6 --lr 0.01 --seq-length 32 --load " + ck);
  INFO(changed.err);
  CHECK(changed.exitCode == 0);
  CHECK(changed.err == at + "--lr is 0.01; the checkpoint's run had 0.001\n" + at +
                           "--lr-decay-iters is 6 (--train-iters); the checkpoint's run had 4: the learning rate schedule "
                           "changes from this step on\n" +
                           at + "--seq-length is 32; the checkpoint's run had 64: the data goes on after the windows "
                                "trained so far, counted in windows of the new length\n");
  // A fine-tune is a new run: nothing is compared.
  auto tuned = test::runTiny("--train-iters 6 --lr 0.01 --finetune --load " + ck);
  CHECK(tuned.exitCode == 0);
  CHECK(tuned.err.empty());
}

TEST_CASE("checkpoint: Megatron-LM's --use-checkpoint-opt_param-scheduler and --override-opt_param-scheduler",
          "[checkpoint][cli][megatron]") {
  test::TempDir dir;
  const std::string ck = dir.path.string() + "/ck";
  REQUIRE(test::runTiny("--train-iters 4 --save " + ck).exitCode == 0);
  // The checkpoint's schedule (lr 0.001, decay over 4 steps), not the flags' lr nor the longer run's decay.
  auto kept = test::runTiny("--train-iters 6 --lr 0.01 --use-checkpoint-opt_param-scheduler --load " + ck);
  INFO(kept.out << kept.err);
  CHECK(kept.exitCode == 0);
  CHECK(kept.err.empty());
  CHECK_THAT(kept.out, Catch::Matchers::Contains("  lr 0.001 -> 0.0001 (cosine, warmup 20), 6 steps"));
  // The flags' schedule, each change a note rather than a warning; other changes are still warned of.
  auto given = test::runTiny("--train-iters 6 --lr 0.01 --seq-length 32 --override-opt_param-scheduler --load " + ck);
  INFO(given.err);
  CHECK(given.exitCode == 0);
  const std::string note = "tpc run: note: resuming " + ck + "/iter_0000004: ";
  CHECK(given.err == note + "--lr is 0.01; the checkpoint's run had 0.001\n" + note +
                         "--lr-decay-iters is 6 (--train-iters); the checkpoint's run had 4: the learning rate schedule "
                         "changes from this step on\ntpc run: warning: resuming " + ck + "/iter_0000004: --seq-length is "
                         "32; the checkpoint's run had 64: the data goes on after the windows trained so far, counted in "
                         "windows of the new length\n");
  auto both = test::runTiny("--train-iters 6 --use-checkpoint-opt_param-scheduler --override-opt_param-scheduler --load " + ck);
  CHECK(both.exitCode == 1);
  CHECK(both.err == "tpc run: error: --use-checkpoint-opt_param-scheduler and --override-opt_param-scheduler exclude each "
                    "other (the checkpoint's lr schedule, or the flags'); give one\n");
  // A fresh run has no checkpoint schedule: as in Megatron-LM, the flags do nothing there.
  CHECK(test::runTiny("--train-iters 1 --override-opt_param-scheduler").exitCode == 0);
  // A schedule state.json does not hold as tpc writes it is named, not trained on.
  std::string state = test::readFile(ck + "/iter_0000004/state.json");
  const std::string lr = "\"lr\": \"0.001\"";
  REQUIRE(state.find(lr) != std::string::npos);
  state.replace(state.find(lr), lr.size(), "\"lr\": \"0.001x\"");
  test::writeFile(ck + "/iter_0000004/state.json", state);
  auto damaged = test::runTiny("--train-iters 6 --use-checkpoint-opt_param-scheduler --load " + ck);
  CHECK(damaged.exitCode == 1);
  CHECK(damaged.err == ck + "/iter_0000004/state.json: error: its lr schedule (lr 0.001x, min-lr "
                       "0.0001, warmup 20, decay 4, cosine) is not a valid one: the file is damaged\n");
}

TEST_CASE("checkpoint: a resume's warnings name the schedule flags as the user gave them", "[checkpoint][cli][megatron]") {
  test::TempDir dir;
  const std::string ck = dir.path.string() + "/ck";
  REQUIRE(test::runTiny("--train-iters 4 --save " + ck).exitCode == 0);
  const std::string at = "tpc run: warning: resuming " + ck + "/iter_0000004: ";
  const std::string changes = ": the learning rate schedule changes from this step on\n";
  // tiny's global batch is 8: 48 samples are 6 steps, and a warmup of 16 samples 2.
  auto samples = test::runTiny("--train-samples 48 --lr-warmup-samples 16 --load " + ck);
  INFO(samples.err);
  CHECK(samples.exitCode == 0);
  CHECK(samples.err == at + "--lr-decay-iters is 6 (--train-samples 48); the checkpoint's run had 4" + changes + at +
                           "--lr-warmup-samples 16 is 2 steps; the checkpoint's run had 20" + changes);
  // A decay in samples and a warmup as a fraction of it (0.25 x 8 steps).
  auto fraction = test::runTiny("--train-iters 6 --lr-decay-samples 64 --lr-warmup-fraction 0.25 --load " + ck);
  INFO(fraction.err);
  CHECK(fraction.exitCode == 0);
  CHECK(fraction.err == at + "--lr-decay-samples 64 is 8 steps; the checkpoint's run had 4" + changes + at +
                            "--lr-warmup-fraction 0.25 is 2 steps; the checkpoint's run had 20" + changes);
}

TEST_CASE("checkpoint: a save killed halfway leaves the previous checkpoint as the latest", "[checkpoint][cli]") {
  test::TempDir dir;
  std::string ck = dir.path.string() + "/ck";
  auto killed = test::runCommand("TPC_TEST_KILL_DURING_SAVE=4 " + test::tpcBinary() + " run " + tiny() +
                                 " --threads 2 --train-iters 4 --save-interval 2 --save " + ck);
  CHECK(killed.exitCode == 137);
  CHECK(std::filesystem::exists(ck + "/.tmp.iter_0000004/model.safetensors"));  // the half-written one
  CHECK(!std::filesystem::exists(ck + "/iter_0000004"));
  auto loaded = loadCheckpoint(ck);
  REQUIRE(loaded.ok());
  CHECK(loaded->state.iteration == 2);
  auto resumed = test::runTiny("--train-iters 3 --load " + ck + " --save " + ck);
  CHECK(resumed.exitCode == 0);
  CHECK(!std::filesystem::exists(ck + "/.tmp.iter_0000004"));  // swept by the next save
  CHECK(std::filesystem::exists(ck + "/iter_0000003/state.json"));
}

TEST_CASE("checkpoint: bad checkpoints give one error naming the tensor or file, exit 1", "[checkpoint][cli]") {
  test::TempDir dir;
  std::string ck = dir.path.string() + "/ck";
  REQUIRE(test::runTiny("--train-iters 1 --save " + ck).exitCode == 0);
  auto fail = [&](const std::string& args, const std::string& expected) {
    auto r = test::runTiny(args);
    INFO(r.err);
    CHECK(r.exitCode == 1);
    CHECK(std::count(r.err.begin(), r.err.end(), '\n') == 1);
    CHECK(r.err.find(expected) != std::string::npos);
  };
  fail("--train-iters 2 --load " + dir.path.string() + "/none", "no such checkpoint directory");
  // Another model shape: a wider hidden size.
  std::string other = dir.path.string() + "/wide.fb";
  REQUIRE(test::runCommand(test::tpcBinary() + " new gpt --preset tiny --hidden 64 --heads 4 -o " + other).exitCode == 0);
  auto r = test::runCommand(test::tpcBinary() + " run " + other + " --train-iters 2 --load " + ck);
  CHECK(r.exitCode == 1);
  CHECK(r.err.find("tensor wte is f32[257,128], this model needs f32[257,64]") != std::string::npos);
  // A missing tensor, a corrupt file, a missing state.
  std::string st = ck + "/iter_0000001/model.safetensors";
  auto file = readSafetensors(st);
  REQUIRE(file.ok());
  file->tensors.erase(file->tensors.begin() + 1);
  REQUIRE(writeSafetensors(st, *file).ok());
  fail("--train-iters 2 --load " + ck, "tensor wpe is missing");
  test::writeFile(st, "garbage");
  fail("--train-iters 2 --load " + ck, "model.safetensors: error: not a valid safetensors file");
  std::filesystem::remove(ck + "/iter_0000001/state.json");
  fail("--train-iters 2 --load " + ck, "state.json: error: cannot open the checkpoint state");
}

TEST_CASE("checkpoint: a file, or a latest file naming a missing iteration, is named for what it is", "[checkpoint]") {
  test::TempDir dir;
  test::writeFile(dir / "model.fb", "not a folder");
  auto file = loadCheckpoint(dir / "model.fb");
  REQUIRE_FALSE(file.ok());
  CHECK(file.error() == dir / "model.fb" +
                            ": error: is a file, not a checkpoint directory (a --save directory or one of its iter_N "
                            "directories)");
  auto none = loadCheckpoint(dir / "none");
  REQUIRE_FALSE(none.ok());
  CHECK(none.error() == dir / "none" + ": error: no such checkpoint directory");
  // Megatron's tracker file naming an iteration whose folder was removed or never copied: not "half-written".
  std::filesystem::create_directories(dir / "ck/iter_0000020");
  test::writeFile(dir / "ck/latest_checkpointed_iteration.txt", "30\n");
  auto missing = loadCheckpoint(dir / "ck");
  REQUIRE_FALSE(missing.ok());
  CHECK(missing.error() == dir / "ck/latest_checkpointed_iteration.txt" + ": error: names iteration 30, but " +
                               (dir / "ck/iter_0000030") + " does not exist (found iter_0000020; pass that directory to use it)");
  std::filesystem::remove(dir / "ck/iter_0000020");
  missing = loadCheckpoint(dir / "ck");
  REQUIRE_FALSE(missing.ok());
  CHECK(missing.error().find("does not exist (nor does any other iter_N)") != std::string::npos);
}

TEST_CASE("checkpoint: the state's seed must be a decimal unsigned number", "[checkpoint]") {
  auto state = [](const std::string& seed) {
    return parseCheckpointState(R"({"format": "tpc-checkpoint-1", "iteration": 3, "data_position": 0, "seed": ")" + seed +
                                    R"("})",
                                "s.json");
  };
  auto ok = state("18446744073709551615");
  INFO((ok.ok() ? std::string() : ok.error()));
  REQUIRE(ok.ok());
  CHECK(ok->seed == 18446744073709551615ull);
  auto negative = parseCheckpointState(R"({"format": "tpc-checkpoint-1", "iteration": -7, "data_position": 0, "seed": "1"})",
                                       "s.json");
  REQUIRE_FALSE(negative.ok());
  CHECK(negative.error() == "s.json: error: iteration must be >= 0, got -7");
  for (const char* bad : {"-1", "12abc", "", " 7", "99999999999999999999"}) {
    INFO(bad);
    auto r = state(bad);
    REQUIRE_FALSE(r.ok());
    CHECK(r.error().find("is not a number") != std::string::npos);
  }
  // A field of the wrong kind is named as such, not reported as missing with the others.
  for (auto [fields, expected] : std::vector<std::pair<std::string, std::string>>{
           {R"("iteration": "4", "data_position": 0, "seed": "1")", "s.json: error: iteration is not an integer"},
           {R"("iteration": 4, "data_position": 1e30, "seed": "1")", "s.json: error: data_position is not an integer"},
           {R"("iteration": 4, "data_position": 0, "seed": 1)", "s.json: error: seed is not a string of decimal digits"},
           {R"("iteration": 4, "seed": "1")", "s.json: error: data_position is missing; it must be an integer"}}) {
    auto r = parseCheckpointState(R"({"format": "tpc-checkpoint-1", )" + fields + "}", "s.json");
    INFO(fields);
    REQUIRE_FALSE(r.ok());
    CHECK(r.error().rfind(expected, 0) == 0);
  }
}

TEST_CASE("checkpoint: the latest-iteration file holds one decimal number", "[checkpoint][cli]") {
  test::TempDir dir;
  const std::string ck = dir.path.string() + "/ck";
  REQUIRE(test::runTiny("--train-iters 2 --save " + ck).exitCode == 0);
  for (const char* text : {"4x\n", "2.0\n", "-2\n", "\n", "99999999999999999999999\n"}) {
    test::writeFile(ck + "/latest_checkpointed_iteration.txt", text);
    auto r = test::runTiny("--train-iters 3 --load " + ck);
    INFO(text << r.err);
    CHECK(r.exitCode == 1);
    CHECK(r.err.find("latest_checkpointed_iteration.txt: error: holds '") != std::string::npos);
  }
  test::writeFile(ck + "/latest_checkpointed_iteration.txt", "2\n");  // Megatron's form, with its newline
  CHECK(test::runTiny("--train-iters 3 --load " + ck).exitCode == 0);
}

}  // namespace tpc

namespace tpc {

TEST_CASE("checkpoint: a failed save removes the folders it made, never a folder that was there", "[checkpoint]") {
  test::TempDir dir;
  CheckpointState state;
  state.iteration = 3;
  const std::vector<CheckpointTensor> tensors = {{"w", Shape{2, 2}}};
  auto failingRead = [](const std::string& name) -> Result<HostTensor> {
    return makeError("cannot read ", name, " (as a full disk would fail the save)");
  };
  // Folders the save made (a/b/ck): gone again, so a failed first save leaves no empty --save folder.
  const std::filesystem::path made = dir.path / "a" / "b" / "ck";
  Status s = saveCheckpoint(made.string(), state, tensors, failingRead, 0, {});
  REQUIRE_FALSE(s.ok());
  CHECK(s.error().find("cannot read w") != std::string::npos);
  CHECK_FALSE(std::filesystem::exists(dir.path / "a"));
  CHECK(std::filesystem::exists(dir.path));
  // A folder that was there stays, with what it held; only the save's own temporary folder goes.
  const std::filesystem::path existing = dir.path / "mine";
  std::filesystem::create_directories(existing);
  test::writeFile((existing / "notes.txt").string(), "keep me\n");
  REQUIRE_FALSE(saveCheckpoint(existing.string(), state, tensors, failingRead, 0, {}).ok());
  std::vector<std::string> left;
  for (const auto& e : std::filesystem::directory_iterator(existing)) left.push_back(e.path().filename().string());
  CHECK(left == std::vector<std::string>{"notes.txt"});
  // The same save with a readable tensor completes and keeps its folders.
  auto read = [](const std::string&) -> Result<HostTensor> { return HostTensor(TensorType(DType::f32, Shape{2, 2})); };
  REQUIRE(saveCheckpoint(made.string(), state, tensors, read, 0, {}).ok());
  CHECK(std::filesystem::exists(made / "iter_0000003" / "state.json"));
}

}  // namespace tpc

namespace tpc {

TEST_CASE("checkpoint: a resumed run logs each step once, dropping the lines its run wrote past the checkpoint",
          "[checkpoint][cli]") {
  test::TempDir dir;
  const std::string ck = dir.path.string() + "/ck", log = dir.path.string() + "/run.jsonl";
  const std::string common = " --train-iters 6 --eval-interval 0 --log-jsonl " + log;
  REQUIRE(test::runTiny("--save-interval 2 --save " + ck + common).exitCode == 0);
  const std::string whole = test::readFile(log);
  REQUIRE(test::jsonlField(whole, "step") == std::vector<double>{1, 2, 3, 4, 5, 6});
  // As after a crash at step 6 with the last checkpoint at step 4: steps 5 and 6 are trained and logged again.
  auto r = test::runTiny("--load " + ck + "/iter_0000004" + common);
  INFO(r.out << r.err);
  REQUIRE(r.exitCode == 0);
  CHECK_THAT(r.out, Catch::Matchers::Contains(log + ": dropped 2 lines past step 4, the step this run resumes from"));
  const std::string resumed = test::readFile(log);
  CHECK(test::jsonlField(resumed, "step") == std::vector<double>{1, 2, 3, 4, 5, 6});
  CHECK(test::jsonlField(resumed, "loss") == test::jsonlField(whole, "loss"));  // the resume is bit-identical
  // Resuming at the end of the log drops nothing and says nothing.
  auto more = test::runTiny("--load " + ck + " --train-iters 7 --eval-interval 0 --log-jsonl " + log);
  CHECK(more.exitCode == 0);
  CHECK(more.out.find("dropped") == std::string::npos);
  CHECK(test::jsonlField(test::readFile(log), "step") == std::vector<double>{1, 2, 3, 4, 5, 6, 7});
}

}  // namespace tpc
