// `tpc run` on bad input: one clear error line, exit 1; and a short real run with its JSONL log.
#include <algorithm>
#include <chrono>
#include <filesystem>

#include <catch2/catch.hpp>

#include <sys/stat.h>

#include "frontend/data_dir.h"
#include "test_support.h"

namespace tpc {
namespace {

std::string tiny() { return test::binaryPath("models/tiny.fb"); }

// The "| loss X.XXXX" of every step line of `tpc run`'s output, joined.
std::string printedLosses(const std::string& out) {
  std::string s;
  for (size_t p = out.find("| loss "); p != std::string::npos; p = out.find("| loss ", p + 1)) s += out.substr(p, 14) + ";";
  return s;
}

TEST_CASE("tpc run: bad input is one error line with exit 1", "[run][cli]") {
  struct Case {
    std::string args, expected;
  };
  const Case cases[] = {
      {"", "tpc run: error: expected one model file (tpc run gpt.fb)\n"},
      {tiny() + " --data-path /nonexistent/corpus",
       "tpc run: error: --data-path /nonexistent/corpus: /nonexistent/corpus.idx not found (run scripts/fetch_data.sh "
       "build/bin/tpc for the Brown corpus, or make a dataset with 'tpc prepare')\n"},
      // Errors about the config name the flags that set it, and the model file's fields where no flag did.
      {tiny() + " --micro-batch-size 3 --global-batch-size 8",
       "tpc run: error: --global-batch-size=8 must be a multiple of --micro-batch-size=3 (a step is whole micro batches "
       "on every data-parallel rank), e.g. 6 or 9\n"},
      {tiny() + " --dp 3",
       "tpc run: error: config.global_batch_size=8 must be a multiple of config.micro_batch_size x --dp = 8 x 3 = 24 (a "
       "step is whole micro batches on every data-parallel rank), e.g. 24\n"},
      {tiny() + " --min-lr 2", "tpc run: error: --min-lr=2.0 must be <= config.lr=0.001\n"},
      {tiny() + " --lr-decay-style cos", "tpc run: error: --lr-decay-style must be cosine, linear or constant, got 'cos'\n"},
      {tiny() + " --tp 3",
       "tpc run: error: --tp=3 does not divide the model's 4 attention heads (arch.heads), which megatron-tp splits over "
       "the tp ranks; use a tp of 1, 2, 4\n"},
      {tiny() + " --tp 2 --sp --seq-length 63",
       "tpc run: error: --sp splits the sequence over the tp ranks: --seq-length=63 is not a multiple of --tp=2; give a "
       "--seq-length that is\n"},
      {tiny() + " --seq-length 65", ""},  // checked below: longer than the position table
      {tiny() + " --lr abc", "tpc run: error: --lr=abc is not a number\n"},
      {tiny() + " --lr 0 --min-lr 0", "tpc run: error: --lr must be > 0.0, got 0.0\n"},  // before the run's header
      {tiny() + " --data-path " + dataDir() + "/brown/brown_byte.bin",
       "tpc run: error: --data-path " + dataDir() + "/brown/brown_byte.bin: give the dataset's prefix, without .bin: " +
           dataDir() + "/brown/brown_byte\n"},
      {tiny() + " --train-iters 0", "tpc run: error: --train-iters=0 must be >= 1\n"},
      {tiny() + " --backend tpu", "tpc run: error: --backend=tpu is not a backend (expected auto, cpu or cuda)\n"},
      {"/nonexistent/model.fb", ""},
      {"/tmp", "/tmp: error: is a directory, not a model file (MODEL.fb or MODEL.json; tpc new writes one)\n"},
      {tiny() + " --keep 2", "tpc run: error: --keep applies to the checkpoints of --save; add --save DIR\n"},
      {tiny() + " --save ''", "tpc run: error: --save is empty; name the checkpoint folder\n"},
      {tiny() + " --load ''", "tpc run: error: --load is empty; name the checkpoint folder\n"},
      {tiny() + " --bf16 --precision fp32", "tpc run: error: --bf16 and --precision fp32 exclude each other; give one\n"},
      {tiny() + " --collectives foo", "tpc run: error: --collectives=foo is not a collectives mode (expected auto, nccl or virtual)\n"},
      {tiny() + " --lr-warmup-iters 5 --lr-decay-iters 1",
       "tpc run: error: --lr-warmup-iters 5 must be less than --lr-decay-iters 1\n"},
      {tiny() + " --lr-warmup-iters 10 --train-iters 10",
       "tpc run: error: --lr-warmup-iters 10 must be less than --train-iters 10 (the lr decays over the steps after the "
       "warmup; or give --lr-decay-iters)\n"},
      {tiny() + " --save-interval 5", "tpc run: error: --save-interval applies to the checkpoints of --save; add --save DIR\n"},
      {tiny() + " --finetune", "tpc run: error: --finetune takes the parameters of the checkpoint that --load names; add --load DIR\n"},
      {tiny() + " --backend cpu --collectives nccl --tp 2",
       "tpc run: error: --collectives nccl chooses how CUDA ranks talk; this run is on the CPU backend (drop the flag, or "
       "give --backend cuda on a machine with a GPU)\n"},
      // An unusable checkpoint folder before any training, not after it.
      {tiny() + " --save /proc/tpc-ck", ""},
      // The next flag is not a value: "--save --quiet" made a folder named --quiet and dropped --quiet.
      {tiny() + " --save --quiet",
       "tpc run: error: option --save needs a value, but the next argument is the option '--quiet' (write "
       "--save=VALUE for a value that starts with --)\n"},
  };
  for (const Case& c : cases) {
    auto r = test::runCommand(test::tpcBinary() + " run " + c.args);
    INFO("tpc run " << c.args << "\nstderr: " << r.err);
    CHECK(r.exitCode == 1);
    CHECK(std::count(r.err.begin(), r.err.end(), '\n') == 1);
    if (!c.expected.empty()) CHECK(r.err == c.expected);
  }
  auto save = test::runCommand(test::tpcBinary() + " run " + tiny() + " --save /proc/tpc-ck --log-interval 1");
  CHECK(save.err.find("--save /proc/tpc-ck: error: cannot write checkpoints into this folder") != std::string::npos);
  CHECK(save.out.find("step ") == std::string::npos);  // no step ran
  auto seq = test::runCommand(test::tpcBinary() + " run " + tiny() + " --seq-length 65");
  CHECK(seq.err == "tpc run: error: --seq-length=65 is longer than the position table arch.positions=64\n");
  // The audit of the thirty-ninth session: --dp 65536 partitioned every rank's program before its memory was checked
  // (minutes and 12 GB, no message). Rank 0's program is partitioned alone first.
  const auto t0 = std::chrono::steady_clock::now();
  auto wide = test::runCommand(test::tpcBinary() + " run " + tiny() + " --micro-batch-size 1 --seq-length 16 --dp 65536");
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(30));
  CHECK(wide.exitCode == 1);
  CHECK_THAT(wide.err, Catch::Matchers::StartsWith("tpc run: error: --tp 1 --dp 65536: one training step needs about ") &&
                           Catch::Matchers::Contains(" of host memory for the 65536 ranks of this process") &&
                           Catch::Matchers::Contains("give fewer ranks (--tp, --dp) or a process each (mpirun -np N)"));
  // A model file's lr_decay_iters bounds the warmup too (the audit of the thirty-ninth session: warmup 15 of a decay of
  // 10 ran, the lr falling from its peak straight to min-lr).
  test::TempDir dir;
  REQUIRE(test::runCommand(test::tpcBinary() + " new gpt --preset tiny -o " + (dir / "d.json")).exitCode == 0);
  std::string json = test::readFile(dir / "d.json");
  REQUIRE(json.find("\"lr_decay_iters\": 0") != std::string::npos);
  test::writeFile(dir / "d.json", json.replace(json.find("\"lr_decay_iters\": 0"), 19, "\"lr_decay_iters\": 10"));
  auto past = test::runCommand(test::tpcBinary() + " run " + (dir / "d.json") + " --lr-warmup-iters 15");
  CHECK(past.exitCode == 1);
  CHECK(past.err == "tpc run: error: --lr-warmup-iters 15 must be less than the model file's lr_decay_iters 10\n");
  // --save-interval 0 says what happens without --save: not an error.
  auto noSave = test::runCommand(test::tpcBinary() + " run " + tiny() + " --save-interval 0 --train-iters 1 --eval-interval 0");
  CHECK(noSave.exitCode == 0);
  CHECK(noSave.err.empty());
}

// The audit of the thirty-first session: an output path naming the memory-mapped dataset crashed the run (SIGBUS)
// and left the dataset empty; --log-jsonl could overwrite the model file, and --save was made before the other
// flags were checked.
TEST_CASE("tpc run/sample: an output that is an input, inside the checkpoint read, or another output is one error",
          "[run][cli]") {
  test::TempDir dir;
  const std::string d = dir.path.string(), data = d + "/corpus", model = d + "/m.fb";
  for (const char* ext : {".bin", ".idx"})
    std::filesystem::copy_file(dataDir() + "/brown/brown_byte" + ext, data + ext);
  std::filesystem::copy_file(tiny(), model);
  const std::string bin = test::readFile(data + ".bin"), idx = test::readFile(data + ".idx"), fb = test::readFile(model);
  const std::string run = test::tpcBinary() + " run " + model + " --train-iters 2 --data-path " + data + " ";
  struct Case {
    std::string args, expected;
  };
  const Case cases[] = {
      {"--dump-batches " + data + ".bin", "is the dataset (" + data + ".bin): writing it would destroy it"},
      {"--log-jsonl " + d + "/../" + dir.path.filename().string() + "/corpus.idx", "is the dataset"},
      {"--log-jsonl " + model, "is the model file (" + model + ")"},
      {"--dump-batches " + d + "/x --log-jsonl " + d + "/./x", "--dump-batches and --log-jsonl name one file"},
      {"--log-jsonl " + d, "is a directory; name a file to write, not a folder"},
      {"--save " + d + "/new/ck --metrics-port 0", "--metrics-port=0 is out of range"},
      {"--save " + d + "/new/ck --dump-batches " + d + "/b.bin --log-jsonl " + model + "/x.jsonl",
       "m.fb is a file, not a folder"},
      // Files the saves write or delete.
      {"--save " + d + "/new/ck --log-jsonl " + d + "/new/ck/latest_checkpointed_iteration.txt",
       "is where --save " + d + "/new/ck keeps its checkpoints (latest_checkpointed_iteration.txt): a save would "
       "replace or delete it"},
      {"--save " + d + "/new/ck/ --dump-batches " + d + "/new/ck/iter_0000002/b.bin", "keeps its checkpoints (iter_0000002)"},
  };
  for (const Case& c : cases) {
    auto r = test::runCommand(run + c.args);
    INFO(c.args << "\nstderr: " << r.err);
    CHECK(r.exitCode == 1);
    CHECK(std::count(r.err.begin(), r.err.end(), '\n') == 1);
    CHECK(r.err.find(c.expected) != std::string::npos);
    CHECK(r.out.find("step ") == std::string::npos);
  }
  // Nothing written: the inputs as they were, no --save folder, no batches file.
  CHECK(test::readFile(data + ".bin") == bin);
  CHECK(test::readFile(data + ".idx") == idx);
  CHECK(test::readFile(model) == fb);
  CHECK_FALSE(std::filesystem::exists(d + "/new"));
  CHECK_FALSE(std::filesystem::exists(d + "/b.bin"));
  CHECK_FALSE(std::filesystem::exists(d + "/x"));
  // A log beside the checkpoints in the --save folder is kept by the saves.
  std::filesystem::create_directory(d + "/ck2");
  auto beside = test::runCommand(run + "--save " + d + "/ck2 --save-interval 1 --log-jsonl " + d + "/ck2/run.jsonl");
  INFO(beside.err);
  REQUIRE(beside.exitCode == 0);
  const std::string log = test::readFile(d + "/ck2/run.jsonl");
  CHECK(std::count(log.begin(), log.end(), '\n') >= 1);  // written before the saves, kept by them
  CHECK(std::filesystem::exists(d + "/ck2/iter_0000002"));

  // A checkpoint, then outputs inside it while it is read.
  REQUIRE(test::runCommand(run + "--save " + d + "/ck").exitCode == 0);
  const std::string tensors = d + "/ck/iter_0000002/model.safetensors", saved = test::readFile(tensors);
  auto resumed = test::runCommand(test::tpcBinary() + " run " + model + " --train-iters 3 --data-path " + data +
                                  " --load " + d + "/ck --log-jsonl " + tensors);
  CHECK(resumed.exitCode == 1);
  CHECK(resumed.err.find("is inside the checkpoint --load reads") != std::string::npos);
  for (const std::string& out : {tensors, d + "/ck/logits.safetensors"}) {
    auto s = test::runCommand(test::tpcBinary() + " sample --load " + d + "/ck --max-tokens 2 --dump-logits " + out);
    INFO(s.err);
    CHECK(s.exitCode == 1);
    CHECK(s.err == "tpc sample: error: --dump-logits " + out + " is inside the checkpoint --load reads (" + d +
                       "/ck/iter_0000002): pick a file outside it\n");
  }
  CHECK(test::readFile(tensors) == saved);
  CHECK_FALSE(std::filesystem::exists(d + "/ck/logits.safetensors"));
}

// The data audit of the thirty-eighth session: errors that blamed a flag the user never gave or suggested a fix that
// could not work, a FIFO that hung the run, Megatron-LM's --split forms refused.
TEST_CASE("tpc run: data errors name where the value came from and a fix that works", "[run][cli][data]") {
  test::TempDir dir;
  const std::string d = dir.path.string(), tpc = test::tpcBinary();
  // A model file's data_path is named as the file's field, not as --data-path.
  REQUIRE(test::runCommand(tpc + " new gpt --preset tiny --data-path " + d + "/missing -o " + d + "/m.json").exitCode == 0);
  auto missing = test::runCommand(tpc + " run " + d + "/m.json --train-iters 1");
  CHECK(missing.exitCode == 1);
  CHECK(missing.err.find("tpc run: error: " + d + "/m.json: config.data_path " + d + "/missing: " + d +
                         "/missing.idx not found") == 0);
  // tpc new checks a blend's form (weights and prefixes in pairs) when it writes the file.
  auto blend = test::runCommand(tpc + " new gpt --preset tiny --data-path 0.3 a 0.7 -o " + d + "/b.json");
  CHECK(blend.exitCode == 1);
  CHECK(blend.err.find("tpc new: error: --data-path '0.3 a 0.7': weights and prefixes do not pair up") == 0);
  CHECK_FALSE(std::filesystem::exists(d + "/b.json"));
  // A FIFO where the .idx or the model file should be is refused at once, not waited on.
  std::filesystem::copy_file(dataDir() + "/brown/brown_byte.bin", d + "/fifo.bin");
  REQUIRE(::mkfifo((d + "/fifo.idx").c_str(), 0600) == 0);
  REQUIRE(::mkfifo((d + "/fifo.fb").c_str(), 0600) == 0);
  auto fifo = test::runCommand("timeout 20 " + tpc + " run " + tiny() + " --train-iters 1 --data-path " + d + "/fifo");
  CHECK(fifo.exitCode == 1);
  CHECK(fifo.err.find(d + "/fifo.idx is not a regular file") != std::string::npos);
  auto fifoModel = test::runCommand("timeout 20 " + tpc + " run " + d + "/fifo.fb");
  CHECK(fifoModel.exitCode == 1);
  CHECK(fifoModel.err == d + "/fifo.fb: error: is not a regular file (a pipe, device or socket); give a model file "
                             "(MODEL.fb or MODEL.json; tpc new writes one)\n");
  // Megatron-LM's --split forms: fractions, spaces, fewer than three parts.
  for (const char* split : {"98,2", "0.9, 0.05, 0.05", "100"}) {
    auto r = test::runTiny(std::string("--train-iters 1 --eval-interval 0 --split '") + split + "'");
    INFO(split << ": " << r.err);
    CHECK(r.exitCode == 0);
  }
}

TEST_CASE("tpc run: a fresh run's --log-jsonl over an earlier run's log warns that it replaces it", "[run][cli]") {
  test::TempDir dir;
  const std::string log = dir / "run.jsonl";
  auto first = test::runTiny("--train-iters 2 --eval-interval 0 --log-jsonl " + log);
  REQUIRE(first.exitCode == 0);
  CHECK(first.err.empty());
  auto second = test::runTiny("--train-iters 3 --eval-interval 0 --log-jsonl " + log);
  REQUIRE(second.exitCode == 0);
  CHECK(second.err == "tpc run: warning: --log-jsonl " + log + " holds 2 lines of an earlier run; this run's first "
                      "logged step replaces them (to keep them, name another file; a run resumed with --load appends "
                      "instead)\n");
  CHECK(test::jsonlField(test::readFile(log), "step") == std::vector<double>{1, 2, 3});
  // /dev/stdout sent to a file is written where it is, never emptied (the file is the shell's, not an earlier log).
  const std::string out = dir / "out.txt";
  test::writeFile(out, "KEEP\n");
  auto piped = test::runCommand(test::tpcBinary() + " run " + test::binaryPath("models/tiny.fb") +
                                " --threads 2 --log-interval 1 --train-iters 2 --eval-interval 0 --log-jsonl /dev/stdout >> " +
                                out);
  REQUIRE(piped.exitCode == 0);
  CHECK(piped.err.empty());
  const std::string written = test::readFile(out);
  CHECK(written.rfind("KEEP\n", 0) == 0);
  CHECK(written.find("{\"step\": 2, \"loss\": ") != std::string::npos);
  CHECK(written.find("done: 2 steps") != std::string::npos);
}

TEST_CASE("tpc run: a short run logs JSONL and lowers the loss", "[run][cli]") {
  std::string log = test::binaryPath("tests/run_cli.jsonl");
  auto r = test::runCommand(test::tpcBinary() + " run " + tiny() + " --train-iters 12 --log-interval 4 --lr-warmup-iters 2" +
                            " --log-jsonl " + log);
  INFO(r.out << r.err);
  REQUIRE(r.exitCode == 0);
  CHECK(r.out.find("step      4/12 | loss ") != std::string::npos);
  CHECK(r.out.find("ETA") != std::string::npos);
  std::string jsonl = test::readFile(log);
  // Logged steps: the first, every 4th, the last; and the evaluation after the last step, which the model
  // file's eval_interval (50 in tiny.fb) asks for when no --eval-interval is given.
  CHECK(std::count(jsonl.begin(), jsonl.end(), '\n') == 5);
  CHECK(jsonl.find("{\"step\": 12, \"valid_loss\": ") != std::string::npos);
  CHECK(r.out.find("eval at step 12 | valid loss ") != std::string::npos);
  // Where the time of the steps after the first two went.
  CHECK(r.out.find("time per step (steps 3-12): ") != std::string::npos);
  for (const char* key : {"\"step\": ", "\"loss\": ", "\"lr\": ", "\"grad_norm\": ", "\"tokens_per_s\": ", "\"elapsed_s\": "})
    CHECK(jsonl.find(key) != std::string::npos);
  CHECK(jsonl.find("{\"step\": 12, ") != std::string::npos);
  const std::vector<double> losses = test::jsonlField(jsonl, "loss");
  REQUIRE(losses.size() == 4);  // steps 1, 4, 8, 12
  CHECK(losses.back() < losses.front());
}

TEST_CASE("tpc run: a model file without an arch block names what its graph cannot do, and a split too short for a "
          "window names the split", "[run][cli]") {
  test::TempDir dir;
  std::string model = dir / "noarch.json";
  REQUIRE(test::runCommand(test::tpcBinary() + " new gpt --preset tiny -o " + model).exitCode == 0);
  const std::string noArch = test::withoutArchBlock(test::readFile(model));
  REQUIRE(!noArch.empty());
  test::writeFile(model, noArch);
  // The graph's batch is [8,64]; with dp 2 the run's is [16,64].
  auto dp = test::runCommand(test::tpcBinary() + " run " + model + " --dp 2 --global-batch-size 16 --train-iters 1");
  CHECK(dp.exitCode == 1);
  CHECK(dp.err == model + ": error: the graph's %tokens is i32[8,64] but the run asks for [16,64] (micro batch 8 x dp 2); "
                          "this model file has no architecture record to rebuild it from\n");
  // tiny's 257-row vocabulary padded to 384 is not a multiple of 128 x 4.
  auto tp = test::runCommand(test::tpcBinary() + " run " + model + " --tp 4 --train-iters 1");
  CHECK(tp.exitCode == 1);
  CHECK(tp.err.rfind(model + ": error: --tp 4 splits wte's 384 rows over the ranks, which needs a multiple of 128 x tp = 512", 0) == 0);
  // The validation split (the last 50 of 1000 parts) of a 30-document corpus holds too few tokens for a window.
  std::string corpus = dir / "few.txt", text2;
  for (int i = 0; i < 30; ++i) text2 += "doc " + std::to_string(i) + "\n";
  test::writeFile(corpus, text2);
  REQUIRE(test::runCommand(test::tpcBinary() + " prepare --input " + corpus + " --tokenizer byte --output-prefix " +
                           (dir / "few")).exitCode == 0);
  auto r = test::runCommand(test::tpcBinary() + " run " + tiny() + " --seq-length 8 --data-path " + (dir / "few") +
                            " --split 20,9,1 --eval-interval 1 --train-iters 1");
  CHECK(r.exitCode == 1);
  CHECK(r.err.find("the test split (--split=20,9,1): documents [29, 30)") != std::string::npos);
  CHECK(r.err.find("give that split more documents (--split), a shorter --seq-length, or --eval-interval 0") != std::string::npos);
}

// As in Megatron-LM, --eval-iters 0 turns evaluation off (it was refused as out of range).
TEST_CASE("tpc run --eval-iters 0: no evaluation, with or without --eval-interval", "[run][cli]") {
  for (const char* interval : {"", " --eval-interval 1"}) {
    auto r = test::runCommand(test::tpcBinary() + " run " + tiny() + " --train-iters 2 --seq-length 16 --eval-iters 0" + interval);
    INFO(r.out << r.err);
    CHECK(r.exitCode == 0);
    CHECK(r.out.find("no evaluation: --eval-iters 0\n") != std::string::npos);
    CHECK(r.out.find("valid loss") == std::string::npos);
    CHECK(r.out.find("test loss") == std::string::npos);
  }
}

TEST_CASE("tpc run --quiet: no step lines on the console, every logged step still in the JSONL log", "[run][cli]") {
  test::TempDir dir;
  const std::string log = dir.path.string() + "/q.jsonl";
  auto r = test::runTiny("--train-iters 3 --quiet --log-jsonl " + log);  // runTiny logs every step
  INFO(r.out << r.err);
  REQUIRE(r.exitCode == 0);
  CHECK(r.out.find("step      1/3") == std::string::npos);
  CHECK(test::jsonlField(test::readFile(log), "loss").size() == 3);
}

TEST_CASE("tpc run: the same seed gives the same losses", "[run][cli]") {
  auto a = test::runCommand(test::tpcBinary() + " run " + tiny() + " --train-iters 3 --log-interval 1 --seed 7");
  auto b = test::runCommand(test::tpcBinary() + " run " + tiny() + " --train-iters 3 --log-interval 1 --seed 7 --threads 1");
  auto c = test::runCommand(test::tpcBinary() + " run " + tiny() + " --train-iters 3 --log-interval 1 --seed 8");
  REQUIRE(a.exitCode == 0);
  auto losses = [](const std::string& out) {
    std::string s;
    for (size_t p = out.find("loss "); p != std::string::npos; p = out.find("loss ", p + 1)) s += out.substr(p, 12) + ";";
    return s;
  };
  CHECK(losses(a.out) == losses(b.out));
  CHECK(losses(a.out) != losses(c.out));
}

TEST_CASE("tpc run: dp 2 x tp 2 accepts a global batch of micro x dp and trains like one rank", "[run][cli]") {
  const std::string common = " --train-iters 2 --log-interval 1 --seed 3";
  auto one = test::runCommand(test::tpcBinary() + " run " + tiny() + " --micro-batch-size 8 --global-batch-size 8" + common);
  INFO(one.out << one.err);
  REQUIRE(one.exitCode == 0);
  struct Case {
    std::string args, batchLine;
  };
  const Case cases[] = {
      {"--dp 2 --tp 2 --micro-batch-size 4 --global-batch-size 8", "micro 4 x accumulation 1 x dp 2 = global 8"},
      {"--tp 2 --dp 2 --micro-batch-size 2 --global-batch-size 8", "micro 2 x accumulation 2 x dp 2 = global 8"},
  };
  for (const Case& c : cases) {
    auto r = test::runCommand(test::tpcBinary() + " run " + tiny() + " " + c.args + common);
    INFO("tpc run " << c.args << "\n" << r.out << r.err);
    REQUIRE(r.exitCode == 0);
    CHECK(r.out.find("mesh(dp=2, tp=2)") != std::string::npos);
    CHECK(r.out.find(c.batchLine) != std::string::npos);
    CHECK(printedLosses(r.out).size() > 20);
    CHECK(printedLosses(r.out) == printedLosses(one.out));  // the printed 4 decimals of the loss at both steps
  }
}

TEST_CASE("tpc dump --tp without --after: the rank's program, and a tp that does not divide the heads is an error",
          "[dump][cli][errors]") {
  const std::string gpt2 = test::binaryPath("models/gpt2.fb");
  auto bad = test::runCommand(test::tpcBinary() + " dump " + gpt2 + " --tp 5");
  CHECK(bad.exitCode == 1);
  CHECK(bad.out.empty());
  CHECK(bad.err == "tpc dump: error: --tp=5 does not divide the model's 12 attention heads (arch.heads), which "
                   "megatron-tp splits over the tp ranks; use a tp of 1, 2, 3, 4, 6, 12\n");
  // A pass's own error names the model file, and the pass once.
  auto pass = test::runCommand(test::tpcBinary() + " dump " + gpt2 + " --passes 'data-parallel(dp=3)'");
  CHECK(pass.exitCode == 1);
  CHECK(pass.err == gpt2 + ": error: pass 'data-parallel': dp=3 does not divide the batch (dim 0 = 16) of input tokens "
                           "i32[16,1024] on mesh axis dp\n");
  CHECK(std::count(bad.err.begin(), bad.err.end(), '\n') == 1);
  auto help = test::runCommand(test::tpcBinary() + " help dump");
  CHECK(help.exitCode == 0);
  CHECK(help.out == test::runCommand(test::tpcBinary() + " dump --help").out);
  CHECK_THAT(help.out, Catch::StartsWith("usage: tpc dump"));
  auto rank = test::runCommand(test::tpcBinary() + " dump " + tiny() + " --tp 2 --micro-batch-size 4");
  INFO(rank.err);
  CHECK(rank.exitCode == 0);
  CHECK_THAT(rank.out, Catch::Contains("all_reduce"));  // the partitioned program, not the forward graph
  auto plain = test::runCommand(test::tpcBinary() + " dump " + tiny() + " --micro-batch-size 4 --format dot");
  CHECK(plain.exitCode == 0);
  CHECK_THAT(plain.out, Catch::StartsWith("digraph"));  // --format applies to the forward graph too
}

TEST_CASE("tpc run/dump: a flag that does nothing in this config is one warning, not silence", "[run][dump][cli]") {
  auto sp = test::runCommand(test::tpcBinary() + " run " + tiny() + " --sp --train-iters 1 --eval-interval 0");
  CHECK(sp.exitCode == 0);
  CHECK(sp.err == "tpc run: warning: --sp does nothing with tp 1 (it splits the sequence over the tp ranks); add --tp N\n");
  auto zero = test::runCommand(test::tpcBinary() + " dump " + tiny() + " --use-distributed-optimizer --summary");
  CHECK(zero.exitCode == 0);
  CHECK(zero.err == "tpc dump: warning: --use-distributed-optimizer does nothing with dp 1 (it shards the AdamW state over "
                    "the dp ranks); add --dp N\n");
  auto quiet = test::runCommand(test::tpcBinary() + " dump " + tiny() + " --sp --tp 2 --use-distributed-optimizer --dp 2 --micro-batch-size 4 --summary");
  CHECK(quiet.exitCode == 0);
  CHECK(quiet.err.empty());
  auto rank = test::runCommand(test::tpcBinary() + " dump " + tiny() + " --rank 1");
  CHECK(rank.exitCode == 1);
  CHECK(rank.out.empty());
  CHECK(rank.err == "tpc dump: error: --rank 1: the step is not sharded, so it has rank 0 alone; give --tp/--dp to shard "
                    "it, or drop --rank\n");
}

TEST_CASE("tpc run/dump --use-distributed-optimizer: ZeRO-1 over dp trains like one rank", "[run][cli][zero1]") {
  const std::string common = " --train-iters 2 --log-interval 1 --seed 3";
  auto one = test::runCommand(test::tpcBinary() + " run " + tiny() + " --micro-batch-size 8 --global-batch-size 8" + common);
  REQUIRE(one.exitCode == 0);
  // dp 2; dp 2 x tp 2 with sp and 2 accumulated micro batches.
  for (std::string mesh : {"--dp 2 --micro-batch-size 4", "--dp 2 --tp 2 --sp --micro-batch-size 2"}) {
    auto r = test::runCommand(test::tpcBinary() + " run " + tiny() + " " + mesh +
                              " --use-distributed-optimizer --global-batch-size 8" + common);
    INFO(mesh << "\n" << r.out << r.err);
    REQUIRE(r.exitCode == 0);
    CHECK(printedLosses(r.out).size() > 20);
    CHECK(printedLosses(r.out) == printedLosses(one.out));
  }
  // The dump's summary shows the reduce_scatter/all_gather pairs and the halved optimizer state.
  auto zero = test::runCommand(test::tpcBinary() + " dump " + tiny() +
                               " --dp 2 --use-distributed-optimizer --micro-batch-size 4 --after=partition --summary");
  auto plain = test::runCommand(test::tpcBinary() + " dump " + tiny() + " --dp 2 --micro-batch-size 4 --after=partition --summary");
  INFO(zero.out << zero.err << plain.out << plain.err);
  REQUIRE(zero.exitCode == 0);
  REQUIRE(plain.exitCode == 0);
  CHECK(zero.out.find("reduce_scatter(dp): ") != std::string::npos);
  CHECK(zero.out.find("all_gather(dp): ") != std::string::npos);
  CHECK(zero.out.find("(1/2.00)") != std::string::npos);
  CHECK(plain.out.find("reduce_scatter") == std::string::npos);
  CHECK(plain.out.find("optimizer state") == std::string::npos);
}

}  // namespace
}  // namespace tpc

namespace tpc {
namespace {

TEST_CASE("tpc run: a .json model file trains like its .fb twin", "[run][cli]") {
  std::string dir = test::binaryPath("tests");
  for (const char* ext : {".json", ".fb"}) {
    auto made = test::runCommand(test::tpcBinary() + " new gpt --preset tiny --layers 1 -o " + dir + "/run_twin" + ext);
    REQUIRE(made.exitCode == 0);
  }
  auto js = test::runCommand(test::tpcBinary() + " run " + dir + "/run_twin.json --train-iters 2 --log-interval 1");
  auto fb = test::runCommand(test::tpcBinary() + " run " + dir + "/run_twin.fb --train-iters 2 --log-interval 1");
  INFO(js.err << fb.err);
  REQUIRE(js.exitCode == 0);
  REQUIRE(fb.exitCode == 0);
  auto lossLines = [](const std::string& out) {
    std::string s;
    for (size_t p = out.find("| loss "); p != std::string::npos; p = out.find("| loss ", p + 1)) s += out.substr(p, 14);
    return s;
  };
  CHECK(!lossLines(js.out).empty());
  CHECK(lossLines(js.out) == lossLines(fb.out));
}

}  // namespace
}  // namespace tpc

TEST_CASE("tpc run --help: the flags and both ways to start a run (one process, or mpirun a process per rank)", "[run][cli]") {
  auto r = tpc::test::runCommand(tpc::test::tpcBinary() + " run --help");
  REQUIRE(r.exitCode == 0);
  CHECK(r.out.find("usage: tpc run MODEL.fb|MODEL.json [training flags]") != std::string::npos);
  CHECK(r.out.find("mpirun -np N tpc run MODEL.fb --tp/--dp/--sp ... (a process per mesh rank") != std::string::npos);
  CHECK(r.out.find("with --backend cuda each drives the GPU of its local rank, NCCL between them") != std::string::npos);
  CHECK(r.out.find("--collective-timeout") != std::string::npos);
}
