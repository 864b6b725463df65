// Dataset blends (Megatron-LM's --data-path with several prefixes): the words' forms and errors, Megatron's
// blending order, the windows each dataset gives, exact resumption, and the flag parser's several-word values.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "frontend/data_blend.h"
#include "frontend/dataset_writer.h"
#include "frontend/indexed_dataset.h"
#include "frontend/token_windows.h"
#include "test_support.h"

using namespace tpc;

namespace {

// Documents whose tokens say which dataset they come from: dataset `tag`'s tokens are tag * 1000 + 0..999.
void writeTagged(const std::string& prefix, int tag, int docs) {
  auto w = DatasetWriter::create(prefix, TokenDType::UInt16);
  REQUIRE(w.ok());
  for (int d = 0; d < docs; ++d) {
    std::vector<int32_t> doc(size_t(7 + d % 5));
    for (size_t i = 0; i < doc.size(); ++i) doc[i] = tag * 1000 + int32_t((d * 13 + int(i)) % 1000);
    REQUIRE(w->addDocument(doc).ok());
  }
  REQUIRE(w->finish().ok());
}

BlendedWindows::Part part(const std::string& prefix, double weight, DocRange docs) {
  auto ds = IndexedDataset::open(prefix);
  REQUIRE(ds.ok());
  return {std::move(ds).value(), docs, weight};
}

// A vector of parts (an initializer list would copy them, and a part holds its memory maps).
template <class... P>
std::vector<BlendedWindows::Part> parts(P&&... p) {
  std::vector<BlendedWindows::Part> v;
  (v.push_back(std::forward<P>(p)), ...);
  return v;
}

std::vector<std::vector<int32_t>> read(BlendedWindows& w, size_t n, uint32_t seq) {
  std::vector<std::vector<int32_t>> out;
  for (size_t i = 0; i < n; ++i) {
    std::vector<int32_t> win(seq + 1);
    REQUIRE(w.next(win.data()).ok());
    out.push_back(win);
  }
  return out;
}

}  // namespace

TEST_CASE("a --data-path value is one prefix, prefixes, or weight-prefix pairs", "[dataset][blend]") {
  auto one = parseDataBlend("data/web");
  REQUIRE(one.ok());
  REQUIRE(one->size() == 1);
  CHECK((*one)[0].prefix == "data/web");
  CHECK((*one)[0].weight == 0);

  auto sized = parseDataBlend("  web\tbooks  ");
  REQUIRE(sized.ok());
  REQUIRE(sized->size() == 2);
  CHECK(((*sized)[0].prefix == "web" && (*sized)[1].prefix == "books"));

  auto weighted = parseDataBlend("0.3 web 7e-1 books");
  REQUIRE(weighted.ok());
  REQUIRE(weighted->size() == 2);
  CHECK(((*weighted)[0].prefix == "web" && (*weighted)[0].weight == 0.3));
  CHECK(((*weighted)[1].prefix == "books" && (*weighted)[1].weight == 0.7));

  // One word is a prefix, even a number (Megatron-LM's get_blend_from_list); words joined by newlines keep their
  // spaces; a value a dataset check accepts whole is one prefix.
  auto numeric = parseDataBlend("7");
  REQUIRE(numeric.ok());
  CHECK(((*numeric).size() == 1 && (*numeric)[0].prefix == "7"));
  auto spaced = parseDataBlend("0.5\nmy data/web\n0.5\nbooks");
  REQUIRE(spaced.ok());
  REQUIRE(spaced->size() == 2);
  CHECK((*spaced)[0].prefix == "my data/web");
  auto whole = parseDataBlend("my data/web", [](const std::string& p) { return p == "my data/web"; });
  REQUIRE(whole.ok());
  CHECK(((*whole).size() == 1 && (*whole)[0].prefix == "my data/web"));
  auto split = parseDataBlend("my data/web", [](const std::string&) { return false; });
  REQUIRE(split.ok());
  CHECK(split->size() == 2);
  CHECK(looksLikeModelFile("gpt.fb"));
  CHECK(looksLikeModelFile("m.json"));
  CHECK_FALSE(looksLikeModelFile("data/web"));
  CHECK_FALSE(looksLikeModelFile(".fb"));

  struct Case {
    const char* spec;
    const char* expected;
  };
  for (const Case& c : {Case{"", "no dataset prefix given"}, Case{"   ", "no dataset prefix given"},
                        Case{"0.3 web 0.7", "do not pair up (3 words)"}, Case{"web 0.5", "'0.5' is a number among prefixes"},
                        Case{"0 web 1 books", "the weight 0 of 'web' is not a positive number"},
                        Case{"-1 web", "the weight -1 of 'web'"}, Case{"nan web", "the weight nan of 'web'"},
                        Case{"inf web", "the weight inf of 'web'"}, Case{"0.5 web books 0.5", "'books' should be the weight of '0.5'"},
                        Case{"0.5 0.5", "'0.5' stands where a prefix should"}}) {
    auto r = parseDataBlend(c.spec);
    INFO(c.spec);
    REQUIRE_FALSE(r.ok());
    CHECK(r.error().find(c.expected) != std::string::npos);
    CHECK(r.error().find("--data-path") == 0);
  }
}

TEST_CASE("the blending order is Megatron's build_blending_indices", "[dataset][blend]") {
  // Worked by hand from Megatron's rule (largest weight * max(s, 1) - taken, the first on a tie):
  // s=0: .25, .75 -> 1; s=1: .25, -.25 -> 0; s=2: -.5, .5 -> 1; s=3: -.25, .25 -> 1; s=4: 0, 0 -> 0; then 1, 1, 1.
  BlendOrder order({1, 3});
  std::vector<size_t> seq;
  for (int i = 0; i < 8; ++i) seq.push_back(order.next());
  CHECK(seq == std::vector<size_t>{1, 0, 1, 1, 0, 1, 1, 1});
  CHECK(order.taken() == std::vector<uint64_t>{2, 6});  // Megatron's own test of this helper: [2, 6]
  BlendOrder halves({0.5, 0.5});
  for (int i = 0; i < 6; ++i) CHECK(halves.next() == size_t(i % 2));
  // Weights whose sum overflows a double keep their proportions (every share was 0 and the first dataset was drawn).
  BlendOrder huge({1e308, 1e308, 1});
  CHECK(huge.weights()[0] == 0.5);
  CHECK(huge.weights()[1] == 0.5);
  CHECK(huge.weights()[2] < 1e-300);
  for (int i = 0; i < 1000; ++i) huge.next();
  CHECK(huge.taken()[0] >= 499);
  CHECK(huge.taken()[1] >= 499);
  CHECK(huge.taken()[2] <= 1);  // Megatron's rule draws it once, where the other two meet their shares exactly

  // Every prefix of the order keeps each dataset within one sample of its share, and seek(k) is k calls of next().
  const std::vector<double> weights{0.2, 0.5, 0.3};
  BlendOrder a(weights);
  std::vector<size_t> stream;
  for (uint64_t s = 1; s <= 5000; ++s) {
    stream.push_back(a.next());
    for (size_t i = 0; i < weights.size(); ++i) REQUIRE(std::abs(double(a.taken()[i]) - weights[i] * double(s)) <= 1.0);
  }
  for (uint64_t at : {uint64_t(0), uint64_t(1), uint64_t(17), uint64_t(4000)}) {
    BlendOrder b(weights);
    REQUIRE(b.seek(at).ok());
    CHECK(b.position() == at);
    for (uint64_t s = at; s < at + 200; ++s) REQUIRE(b.next() == stream[s]);
  }

  // The counts at a recent position, as a checkpoint stores them, set the state without the replay.
  BlendOrder c(weights);
  c.keepRecent(64);
  for (int s = 0; s < 3000; ++s) c.next();
  CHECK(c.takenAt(3000 - 65).empty());  // further back than it keeps
  CHECK(c.takenAt(3001).empty());
  for (uint64_t at : {uint64_t(3000 - 64), uint64_t(2990), uint64_t(3000)}) {
    const std::vector<uint64_t> taken = c.takenAt(at);
    BlendOrder replayed(weights);
    REQUIRE(replayed.seek(at).ok());
    CHECK(taken == replayed.taken());
    BlendOrder d(weights);
    REQUIRE(d.seek(at, taken).ok());
    for (uint64_t s = at; s < at + 200; ++s) REQUIRE(d.next() == stream[s]);
  }
  // Counts that cannot be the position's (another blend's, or damaged) are replayed over; a position no run reaches
  // (a damaged state.json) is an error, not a replay that does not end.
  const std::vector<uint64_t> at3000 = c.takenAt(3000);
  for (const std::vector<uint64_t>& wrong : {std::vector<uint64_t>{at3000[0] + 5, at3000[1] - 5, at3000[2]},
                                             std::vector<uint64_t>{at3000[0], at3000[1] + at3000[2]}, at3000}) {
    BlendOrder e(weights);
    const uint64_t at = wrong == at3000 ? 2999 : 3000;
    CHECK_FALSE(e.fits(at, wrong));
    REQUIRE(e.seek(at, wrong).ok());
    for (uint64_t s = at; s < at + 200; ++s) REQUIRE(e.next() == stream[s]);
  }
  BlendOrder e(weights);
  CHECK_THAT(e.seek(uint64_t(1) << 50).error(), Catch::Contains("is past any run's end"));
  // No ring kept: no counts for an earlier position, and no division by its size.
  BlendOrder f(weights);
  for (int s = 0; s < 10; ++s) f.next();
  CHECK(f.takenAt(5).empty());
  CHECK(f.takenAt(10) == f.taken());
}

TEST_CASE("blended windows come from each dataset in the blending order, and resume exactly", "[dataset][blend]") {
  test::TempDir dir;
  const std::string a = dir / "a", b = dir / "b";
  writeTagged(a, 1, 40);
  writeTagged(b, 2, 90);
  const uint32_t seq = 6;

  // One dataset: exactly that dataset's TokenWindows.
  {
    auto ds = IndexedDataset::open(a);
    REQUIRE(ds.ok());
    TokenWindows plain(*ds, {0, 38}, seq, 5);
    BlendedWindows blended(parts(part(a, 0, {0, 38})), seq, 5);
    REQUIRE(blended.status().ok());
    CHECK(blended.windowsPerEpoch() == plain.windowsPerEpoch());
    for (auto& w : read(blended, 2 * plain.windowsPerEpoch() + 3, seq)) {
      std::vector<int32_t> p(seq + 1);
      REQUIRE(plain.next(p.data()).ok());
      REQUIRE(w == p);
    }
  }

  // Weighted: window s is dataset order[s]'s next window of its own order.
  BlendedWindows blend(parts(part(a, 0.25, {0, 38}), part(b, 0.75, {0, 85})), seq, 5);
  REQUIRE(blend.status().ok());
  CHECK(blend.share(0) == 0.25);
  auto dsA = IndexedDataset::open(a), dsB = IndexedDataset::open(b);
  REQUIRE((dsA.ok() && dsB.ok()));
  TokenWindows alone[2] = {TokenWindows(*dsA, {0, 38}, seq, 5), TokenWindows(*dsB, {0, 85}, seq, 5)};
  BlendOrder order({0.25, 0.75});
  const size_t n = 3 * alone[0].windowsPerEpoch() + 11;  // past an epoch of the smaller dataset
  auto stream = read(blend, n, seq);
  size_t fromA = 0;
  for (size_t s = 0; s < n; ++s) {
    size_t which = order.next();
    std::vector<int32_t> expect(seq + 1);
    REQUIRE(alone[which].next(expect.data()).ok());
    REQUIRE(stream[s] == expect);
    for (int32_t t : stream[s]) REQUIRE(t / 1000 == int(which) + 1);
    fromA += which == 0;
  }
  CHECK(std::abs(double(fromA) - 0.25 * double(n)) <= 1.0);

  for (uint64_t at : {uint64_t(0), uint64_t(5), uint64_t(n / 2), uint64_t(n - 3)}) {
    BlendedWindows resumed(parts(part(a, 0.25, {0, 38}), part(b, 0.75, {0, 85})), seq, 5);
    REQUIRE(resumed.seek(at).ok());
    CHECK(resumed.position() == at);
    auto rest = read(resumed, n - at, seq);
    for (size_t s = at; s < n; ++s) REQUIRE(rest[s - at] == stream[s]);
  }

  // No weights: shares by windows per epoch, so each dataset goes through its epochs at one pace.
  BlendedWindows sized(parts(part(a, 0, {0, 40}), part(b, 0, {0, 90})), seq, 5);
  REQUIRE(sized.status().ok());
  const double wa = double(sized.windows(0).windowsPerEpoch()), wb = double(sized.windows(1).windowsPerEpoch());
  CHECK(sized.share(0) == Approx(wa / (wa + wb)));
  CHECK(sized.windowsPerEpoch() == uint64_t(wa + wb));
  read(sized, sized.windowsPerEpoch(), seq);
  CHECK(sized.windows(0).position() == uint64_t(wa));
  CHECK(sized.windows(1).position() == uint64_t(wb));
}

TEST_CASE("a blend part that cannot give a window is an error naming its dataset", "[dataset][blend][errors]") {
  test::TempDir dir;
  const std::string a = dir / "a", tiny = dir / "tiny";
  writeTagged(a, 1, 20);
  writeTagged(tiny, 2, 1);
  BlendedWindows w(parts(part(a, 0.5, {0, 20}), part(tiny, 0.5, {0, 1})), 64, 1);
  REQUIRE_FALSE(w.status().ok());
  CHECK(w.status().error().find(tiny) != std::string::npos);
  std::vector<int32_t> out(65);
  CHECK_FALSE(w.next(out.data()).ok());
}

// The flag parser's several-word value, through the binary: `tpc new` writes what --data-path took into the model
// file, and `tpc run` trains on a blend and resumes it.
TEST_CASE("tpc new/run: --data-path takes the words up to the next option, and a blend trains and resumes",
          "[cli][blend]") {
  test::TempDir dir;
  const std::string d = dir.path.string(), a = d + "/a", b = d + "/b", model = d + "/m.json";
  writeTagged(a, 1, 300);
  writeTagged(b, 2, 500);
  auto made = test::runCommand(test::tpcBinary() + " new gpt --preset tiny --vocab 3000 --seq 16 --data-path 0.3 " + a +
                               " 0.7 " + b + " -o " + model);
  INFO(made.err);
  REQUIRE(made.exitCode == 0);
  CHECK(test::readFile(model).find("\"data_path\": \"0.3 " + a + " 0.7 " + b + "\"") != std::string::npos);
  CHECK(test::runCommand(test::tpcBinary() + " new --help").out.find("--data-path VALUE...") != std::string::npos);

  const std::string run = test::tpcBinary() + " run " + model + " --micro-batch-size 2 --eval-interval 0 --lr 1e-3 ";
  auto full = test::runCommand(run + "--train-iters 4 --dump-batches " + d + "/full.bin");
  INFO(full.out << full.err);
  REQUIRE(full.exitCode == 0);
  CHECK(full.out.find("  data: a blend of 2 datasets, by the weights given (share of the training windows):\n"
                      "    30.0% " + a + " (300 documents, ") != std::string::npos);
  CHECK(full.out.find("    70.0% " + b + " (500 documents, ") != std::string::npos);
  // Windows from both datasets, in the blend's order: sample 0 from b, 1 from a (weights .3/.7: .3 < .7, then
  // .3 > -.3).
  const std::string batches = test::readFile(d + "/full.bin");
  REQUIRE(batches.size() == 4 * 2 * 17 * sizeof(int32_t));
  auto token = [&](size_t row) {
    int32_t t;
    std::memcpy(&t, batches.data() + row * 17 * sizeof(int32_t), sizeof t);
    return t;
  };
  CHECK(token(0) / 1000 == 2);
  CHECK(token(1) / 1000 == 1);

  // 2 steps, save, 2 more: the same windows as the 4 steps in one run.
  REQUIRE(test::runCommand(run + "--train-iters 2 --save " + d + "/ck --dump-batches " + d + "/first.bin").exitCode == 0);
  auto resumed = test::runCommand(run + "--train-iters 4 --load " + d + "/ck --dump-batches " + d + "/rest.bin");
  INFO(resumed.err);
  REQUIRE(resumed.exitCode == 0);
  CHECK(test::readFile(d + "/first.bin") + test::readFile(d + "/rest.bin") == batches);
  // The checkpoint holds each dataset's windows taken: the blend's state at its position, so that a resume needs no
  // replay of the order.
  const std::string statePath = d + "/ck/iter_0000002/state.json", state = test::readFile(statePath);
  const nlohmann::json saved = nlohmann::json::parse(state);
  INFO(state);
  const uint64_t position = saved.at("data_position").get<uint64_t>();
  const std::vector<uint64_t> taken = saved.at("data_taken").get<std::vector<uint64_t>>();
  REQUIRE(taken.size() == 2);
  CHECK(taken[0] + taken[1] == position);
  BlendOrder order({0.3, 0.7});
  REQUIRE(order.seek(position).ok());
  CHECK(order.taken() == taken);
  // A damaged state.json: one error naming it, at once (a position far past any run's end was replayed for hours).
  auto resumeFrom = [&](const nlohmann::json& bad) {
    test::writeFile(statePath, bad.dump(2));
    auto r = test::runCommand("timeout 60 " + run + "--train-iters 4 --load " + d + "/ck");
    test::writeFile(statePath, state);
    return r;
  };
  nlohmann::json far = saved;
  far.erase("data_taken");  // as a checkpoint from before data_taken: the order is replayed
  far["data_position"] = 1000000000000000ull;
  auto farPosition = resumeFrom(far);
  CHECK(farPosition.exitCode == 1);
  CHECK(farPosition.err.find("data_position 1000000000000000 cannot resume the training data: position "
                             "1000000000000000 is past any run's end") != std::string::npos);
  // Without data_taken (an older checkpoint), or with counts that do not fit the blend, the replay resumes the same
  // windows.
  nlohmann::json old = saved, threeCounts = saved;
  old.erase("data_taken");
  threeCounts["data_taken"] = {taken[0], taken[1], 0};
  for (const nlohmann::json& st : {old, threeCounts}) {
    test::writeFile(statePath, st.dump(2));
    std::filesystem::remove(d + "/replayed.bin");
    auto replayed = test::runCommand(run + "--train-iters 4 --load " + d + "/ck --dump-batches " + d + "/replayed.bin");
    INFO(replayed.err);
    REQUIRE(replayed.exitCode == 0);
    CHECK(test::readFile(d + "/first.bin") + test::readFile(d + "/replayed.bin") == batches);
  }
  test::writeFile(statePath, state);
  // A resume under other weights replays the new blend's order (the change is warned of), as it did before data_taken.
  const std::string reweighed = test::tpcBinary() + " run " + model + " --micro-batch-size 2 --eval-interval 0 --lr 1e-3 " +
                                "--train-iters 4 --load " + d + "/ck --data-path 0.5 " + a + " 0.5 " + b;
  auto other = test::runCommand(reweighed + " --dump-batches " + d + "/other.bin");
  INFO(other.err);
  REQUIRE(other.exitCode == 0);
  CHECK(other.err.find("warning: resuming") != std::string::npos);
  BlendOrder half({0.5, 0.5});
  REQUIRE(half.seek(position).ok());
  CHECK(half.taken() != taken);  // so that the check below tells the two apart
  const std::string otherRows = test::readFile(d + "/other.bin");
  const size_t rowBytes = 17 * sizeof(int32_t);
  REQUIRE(otherRows.size() == batches.size() - test::readFile(d + "/first.bin").size());
  for (size_t row = 0; row < otherRows.size() / rowBytes; ++row) {
    int32_t t;
    std::memcpy(&t, otherRows.data() + row * rowBytes, sizeof t);
    REQUIRE(t / 1000 == int(half.next()) + 1);  // a's windows are tagged 1xxx, b's 2xxx
  }

  // The model file given after --data-path was read as a prefix: one error that says so.
  auto late = test::runCommand(test::tpcBinary() + " run --data-path " + a + " " + model);
  CHECK(late.exitCode == 1);
  CHECK(late.err.find("'" + model + "' was read as a dataset prefix of --data-path") != std::string::npos);
  auto odd = test::runCommand(run + "--train-iters 1 --data-path 0.3 " + a + " 0.7");
  CHECK(odd.exitCode == 1);
  CHECK(odd.err.find("weights and prefixes do not pair up") != std::string::npos);
  // A negative weight is one of --data-path's words, refused as a weight (it was "unknown option '-0.7'").
  auto negative = test::runCommand(run + "--train-iters 1 --data-path 0.3 " + a + " -0.7 " + b);
  INFO(negative.err);
  CHECK(negative.exitCode == 1);
  CHECK(negative.err.find("the weight -0.7 of '" + b + "' is not a positive number") != std::string::npos);
  // `tpc new`: the architecture or the output given after --data-path is named, not swallowed.
  for (const std::string& args : {" new gpt --data-path " + a + " gpt -o " + d + "/x.json",
                                  " new --data-path " + a + " gpt --preset tiny -o " + d + "/x.json"}) {
    auto swallowed = test::runCommand(test::tpcBinary() + args);
    INFO(args << ": " << swallowed.err);
    CHECK(swallowed.exitCode == 1);
    CHECK(swallowed.err.find("'gpt' was read as a dataset prefix of --data-path") != std::string::npos);
    CHECK_FALSE(std::filesystem::exists(d + "/x.json"));
  }

  // A dataset folder with a space in its name: one word, with other words, or in the model file.
  std::filesystem::create_directories(d + "/my data");
  writeTagged(d + "/my data/c", 2, 300);
  const std::string spacedPrefix = d + "/my data/c";
  for (const std::string& flag : {"--data-path '" + spacedPrefix + "'", "'--data-path=" + spacedPrefix + "'",
                                  "--data-path 0.5 '" + spacedPrefix + "' 0.5 " + a}) {
    auto r = test::runCommand(run + "--train-iters 1 " + flag);
    INFO(flag << ": " << r.err);
    CHECK(r.exitCode == 0);
    CHECK(r.out.find(spacedPrefix + " (300 documents") != std::string::npos);
  }
  REQUIRE(test::runCommand(test::tpcBinary() + " new gpt --preset tiny --vocab 4000 --seq 16 --data-path '" +
                           spacedPrefix + "' -o " + d + "/spaced.json").exitCode == 0);
  auto fromFile = test::runCommand(test::tpcBinary() + " run " + d + "/spaced.json --micro-batch-size 2 --eval-interval 0 --train-iters 1");
  INFO(fromFile.err);
  CHECK(fromFile.exitCode == 0);
}
