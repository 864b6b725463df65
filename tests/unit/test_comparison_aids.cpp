// `tpc run --dump-batches FILE` and `--save-initial`: the aids that let another trainer (bench/'s PyTorch peer)
// read exactly tpc's batches and start from tpc's initial weights. The dump must hold the trainer's windows in
// order; the iteration-0 checkpoint must be the state a fresh run starts from.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstring>
#include <sstream>

#include "frontend/data_dir.h"
#include "frontend/indexed_dataset.h"
#include "frontend/token_windows.h"
#include "runtime/checkpoint.h"
#include "test_support.h"

namespace tpc {

TEST_CASE("tpc run --dump-batches writes the trainer's windows in order", "[run][cli][compare]") {
  test::TempDir dir;
  // micro 4, accumulation 2: a step reads 8 rows; 3 steps.
  auto r = test::runTiny("--train-iters 3 --micro-batch-size 4 --global-batch-size 8 --seq-length 32 --seed 99 --dump-batches " +
                         dir / "batches.i32");
  REQUIRE(r.exitCode == 0);
  std::string bytes = test::readFile(dir / "batches.i32");
  const size_t rows = 3 * 8, window = 33;
  REQUIRE(bytes.size() == rows * window * sizeof(int32_t));

  // The same windows, drawn directly from the train split with the run's seed.
  auto data = IndexedDataset::open(dataDir() + "/brown/brown_byte");
  REQUIRE(data.ok());
  auto splits = splitDocuments("949,50,1", data->numDocuments());
  REQUIRE(splits.ok());
  TokenWindows windows(*data, splits->train, 32, 99);
  REQUIRE(windows.status().ok());
  std::vector<int32_t> expected(rows * window), got(rows * window);
  for (size_t i = 0; i < rows; ++i) REQUIRE(windows.next(expected.data() + i * window).ok());
  std::memcpy(got.data(), bytes.data(), bytes.size());
  CHECK(got == expected);
  // Not a constant file: the windows differ from each other.
  CHECK(!std::equal(got.begin(), got.begin() + window, got.begin() + window));
}

TEST_CASE("tpc run --dump-batches: an early stop leaves the trained steps' rows, and a resume appends to them",
          "[run][cli][compare][exit]") {
  test::TempDir dir;
  const std::string d = dir.path.string(), common = "--train-iters 5 --eval-interval 0 --seq-length 32 --seed 7 ";
  const size_t stepBytes = 8 * 33 * sizeof(int32_t);  // tiny's global batch of 8 windows of 32 + 1 tokens
  REQUIRE(test::runTiny(common + "--dump-batches " + d + "/whole.i32").exitCode == 0);
  const std::string whole = test::readFile(d + "/whole.i32");
  REQUIRE(whole.size() == 5 * stepBytes);
  // Stopped after step 2: step 3's rows, read ahead while step 2 ran, were not trained on and are not in the file.
  auto first = test::runTiny(common + "--exit-interval 2 --save " + d + "/ck --dump-batches " + d + "/b.i32");
  INFO(first.out << first.err);
  REQUIRE(first.exitCode == 0);
  CHECK(test::readFile(d + "/b.i32") == whole.substr(0, 2 * stepBytes));
  // Going on with the same file appends steps 3-5: the whole run's file.
  auto second = test::runTiny(common + "--save " + d + "/ck --load " + d + "/ck --dump-batches " + d + "/b.i32");
  INFO(second.out << second.err);
  REQUIRE(second.exitCode == 0);
  CHECK(test::readFile(d + "/b.i32") == whole);
  // Another file for the resumed run holds its own steps alone; a file of the whole run given again is cut back to
  // the resumed step first (as a resumed --log-jsonl drops its later lines).
  REQUIRE(test::runTiny(common + "--load " + d + "/ck/iter_0000002 --dump-batches " + d + "/rest.i32").exitCode == 0);
  CHECK(test::readFile(d + "/rest.i32") == whole.substr(2 * stepBytes));
  REQUIRE(test::runTiny(common + "--load " + d + "/ck/iter_0000002 --dump-batches " + d + "/whole.i32").exitCode == 0);
  CHECK(test::readFile(d + "/whole.i32") == whole);
}

TEST_CASE("tpc run --save-initial: iteration 0 is the state a fresh run starts from", "[run][cli][compare][checkpoint]") {
  test::TempDir dir;
  auto fresh = test::runTiny("--train-iters 3 --save " + dir / "ck" + " --save-initial --log-jsonl " + dir / "fresh.jsonl");
  REQUIRE(fresh.exitCode == 0);
  CHECK(fresh.out.find("saved checkpoint " + dir / "ck" + " iteration 0") != std::string::npos);
  auto ck = loadCheckpoint(dir / "ck/iter_0000000");
  REQUIRE(ck.ok());
  CHECK(ck->state.iteration == 0);
  CHECK(ck->state.dataPosition == 0);
  // The AdamW moments of iteration 0 are zero; the weights are the (random, not zero) initialization.
  const HostTensor* m = ck->tensors.find("wte.adam_m");
  const HostTensor* w = ck->tensors.find("wte");
  REQUIRE(m);
  REQUIRE(w);
  CHECK(w->type().str() == "f32[257,128]");  // the real vocabulary, as every checkpoint stores it
  CHECK(std::all_of(m->data<float>(), m->data<float>() + m->numel(), [](float x) { return x == 0; }));
  CHECK(std::any_of(w->data<float>(), w->data<float>() + w->numel(), [](float x) { return x != 0; }));

  // Resumed from iteration 0, the run repeats the fresh run's losses bit for bit.
  auto resumed = test::runTiny("--train-iters 3 --load " + dir / "ck/iter_0000000" + " --log-jsonl " + dir / "resumed.jsonl");
  REQUIRE(resumed.exitCode == 0);
  auto a = test::jsonlField(test::readFile(dir / "fresh.jsonl"), "loss");
  auto b = test::jsonlField(test::readFile(dir / "resumed.jsonl"), "loss");
  REQUIRE(a.size() == 3);
  CHECK(a == b);
}

TEST_CASE("tpc run: --dump-batches and --save-initial misuse is one error line, exit 1", "[run][cli][compare]") {
  test::TempDir dir;
  struct Case {
    std::string args, expected;
  };
  const Case cases[] = {
      {"--save-initial", "tpc run: error: --save-initial writes iteration 0 into the --save folder; add --save DIR\n"},
      {"--save-initial --save " + dir / "a" + " --load " + dir / "a",
       "tpc run: error: --save-initial writes the initial state of a fresh run; drop it when resuming with --load\n"},
      {"--dump-batches /nonexistent/folder/b.i32",
       "--dump-batches /nonexistent/folder/b.i32: error: the folder /nonexistent/folder does not exist; create it "
       "first\n"},
  };
  for (const Case& c : cases) {
    auto r = test::runTiny("--train-iters 1 " + c.args);
    CHECK(r.exitCode == 1);
    CHECK(r.err == c.expected);
  }
}

}  // namespace tpc
