// `tpc run --tensorboard-dir`: TFRecord framing (CRC-32C against its published check value), the Event protobufs
// decoded here by a reader of the wire format written from the protobuf spec, and the scalars against the run's
// JSONL log.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "runtime/tensorboard_writer.h"
#include "test_support.h"

namespace tpc {
namespace {

struct Scalar {
  int64_t step;
  std::string tag;
  float value;
};

// A protobuf message's fields: number -> raw values (varints as numbers, fixed32/64 and length-delimited as bytes).
struct Fields {
  std::multimap<int, uint64_t> numbers;
  std::multimap<int, std::string> bytes;
};

Fields decode(std::string_view m) {
  Fields f;
  size_t i = 0;
  auto varint = [&]() {
    uint64_t v = 0;
    for (int shift = 0;; shift += 7) {
      REQUIRE(i < m.size());
      const auto b = static_cast<unsigned char>(m[i++]);
      v |= uint64_t(b & 0x7F) << shift;
      if (!(b & 0x80)) return v;
    }
  };
  while (i < m.size()) {
    const uint64_t k = varint();
    const int field = int(k >> 3), type = int(k & 7);
    if (type == 0) {
      f.numbers.insert({field, varint()});
    } else {
      const size_t n = type == 1 ? 8 : type == 5 ? 4 : size_t(varint());
      REQUIRE((type == 1 || type == 2 || type == 5));
      REQUIRE(i + n <= m.size());
      f.bytes.insert({field, std::string(m.substr(i, n))});
      i += n;
    }
  }
  return f;
}

// Every record of an event file, its two CRCs checked; the first event's file version; the scalars of the rest.
std::vector<Scalar> readEvents(const std::string& file, std::string& version) {
  std::vector<Scalar> out;
  size_t at = 0, records = 0;
  while (at < file.size()) {
    REQUIRE(at + 12 <= file.size());
    uint64_t len;
    uint32_t lenCrc, dataCrc;
    std::memcpy(&len, file.data() + at, 8);
    std::memcpy(&lenCrc, file.data() + at + 8, 4);
    REQUIRE(lenCrc == maskedCrc32c(std::string_view(file).substr(at, 8)));
    REQUIRE(at + 12 + len + 4 <= file.size());
    const std::string_view data = std::string_view(file).substr(at + 12, len);
    std::memcpy(&dataCrc, file.data() + at + 12 + len, 4);
    REQUIRE(dataCrc == maskedCrc32c(data));
    at += 12 + len + 4;
    Fields e = decode(data);
    REQUIRE(e.bytes.count(1) == 1);  // wall_time, a double
    double wall;
    std::memcpy(&wall, e.bytes.find(1)->second.data(), 8);
    CHECK(wall > 1.7e9);  // seconds since 1970, after 2023
    if (records++ == 0) {
      REQUIRE(e.bytes.count(3) == 1);
      version = e.bytes.find(3)->second;
      continue;
    }
    REQUIRE(e.numbers.count(2) == 1);
    REQUIRE(e.bytes.count(5) == 1);
    const int64_t step = int64_t(e.numbers.find(2)->second);
    Fields summary = decode(e.bytes.find(5)->second);
    for (auto [it, end] = summary.bytes.equal_range(1); it != end; ++it) {
      Fields value = decode(it->second);
      REQUIRE(value.bytes.count(1) == 1);
      REQUIRE(value.bytes.count(2) == 1);
      float v;
      std::memcpy(&v, value.bytes.find(2)->second.data(), 4);
      out.push_back({step, value.bytes.find(1)->second, v});
    }
  }
  return out;
}

std::vector<std::pair<int64_t, float>> series(const std::vector<Scalar>& s, const std::string& tag) {
  std::vector<std::pair<int64_t, float>> out;
  for (const Scalar& x : s)
    if (x.tag == tag) out.push_back({x.step, x.value});
  return out;
}

TEST_CASE("CRC-32C gives its published check value", "[tensorboard]") {
  CHECK(crc32c("123456789") == 0xE3069283u);  // the Castagnoli polynomial's check value (RFC 3720 B.4 family)
  CHECK(crc32c("") == 0u);
  // TensorFlow's mask: rotate right by 15, add 0xa282ead8.
  const uint32_t c = crc32c("abc");
  CHECK(maskedCrc32c("abc") == ((c >> 15 | c << 17) + 0xa282ead8u));
}

TEST_CASE("tpc run --tensorboard-dir writes the run's figures under Megatron-LM's tags", "[tensorboard][run][cli]") {
  test::TempDir dir;
  const std::string d = dir.path.string(), tb = d + "/tb/run1";
  auto r = test::runTiny("--train-iters 4 --eval-interval 2 --eval-iters 1 --split 90,5,5 --tensorboard-dir " + tb +
                         " --log-jsonl " + d + "/log.jsonl");
  INFO(r.out << r.err);
  REQUIRE(r.exitCode == 0);
  CHECK(r.out.find("tensorboard: event files in " + tb + " (tensorboard --logdir " + tb + ")") != std::string::npos);
  std::vector<std::filesystem::path> files;
  for (const auto& e : std::filesystem::directory_iterator(tb)) files.push_back(e.path());
  REQUIRE(files.size() == 1);
  CHECK(files[0].filename().string().find("events.out.tfevents.") == 0);

  std::string version;
  const std::vector<Scalar> scalars = readEvents(test::readFile(files[0].string()), version);
  CHECK(version == "brain.Event:2");
  const std::string jsonl = test::readFile(d + "/log.jsonl");
  const std::vector<double> losses = test::jsonlField(jsonl, "loss"), lrs = test::jsonlField(jsonl, "lr");
  auto loss = series(scalars, "lm loss"), lr = series(scalars, "learning-rate");
  REQUIRE(loss.size() == 4);
  REQUIRE(lr.size() == 4);
  for (size_t i = 0; i < 4; ++i) {
    CHECK(loss[i].first == int64_t(i + 1));
    CHECK(loss[i].second == float(losses[i]));
    CHECK(lr[i].second == float(lrs[i]));
  }
  CHECK(series(scalars, "grad-norm").size() == 4);
  CHECK(series(scalars, "tokens-per-second").size() == 4);
  auto valid = series(scalars, "lm loss validation");
  const std::vector<double> validLogged = test::jsonlField(jsonl, "valid_loss");
  REQUIRE(valid.size() == 2);
  REQUIRE(validLogged.size() == 2);
  CHECK(valid[0].first == 2);
  CHECK(valid[1].first == 4);
  CHECK(valid[1].second == float(validLogged[1]));
  auto ppl = series(scalars, "lm loss validation ppl");
  REQUIRE(ppl.size() == 2);
  CHECK(ppl[0].second == Approx(std::exp(valid[0].second)).epsilon(1e-5));
  auto test = series(scalars, "lm loss test");
  REQUIRE(test.size() == 1);
  CHECK(test[0].first == 4);
}

TEST_CASE("tpc run --tensorboard-dir: a file in the way is one error, and a failed run writes no events",
          "[tensorboard][run][cli]") {
  test::TempDir dir;
  const std::string d = dir.path.string();
  test::writeFile(d + "/file", "x");
  for (const std::string& bad : {d + "/file", d + "/file/sub"}) {
    auto r = test::runTiny("--train-iters 1 --tensorboard-dir " + bad);
    INFO(r.err);
    CHECK(r.exitCode == 1);
    CHECK(std::count(r.err.begin(), r.err.end(), '\n') == 1);
    CHECK(r.err.find("tpc run: error: --tensorboard-dir " + bad) == 0);
    CHECK(r.out.find("step ") == std::string::npos);
  }
  // An empty name, and a folder that cannot be made though its parent looks writable (/proc refuses new entries):
  // refused before the run starts, nothing made.
  for (const std::string& bad : {std::string("''"), std::string("/proc/tpc_tensorboard_test/runs")}) {
    auto r = test::runTiny("--train-iters 1 --tensorboard-dir " + bad);
    INFO(bad << ": " << r.err);
    CHECK(r.exitCode == 1);
    CHECK(std::count(r.err.begin(), r.err.end(), '\n') == 1);
    CHECK(r.err.find("tpc run: error: --tensorboard-dir") == 0);
    CHECK(r.out.find("step ") == std::string::npos);
  }
  CHECK_FALSE(std::filesystem::exists("/proc/tpc_tensorboard_test"));
  // A missing folder that can be made is tried and undone at the start, and made at the first event.
  auto made = test::runTiny("--train-iters 1 --tensorboard-dir " + d + "/new/runs/");
  INFO(made.err);
  CHECK(made.exitCode == 0);
  CHECK(std::filesystem::is_directory(d + "/new/runs"));
  // A run that fails before its first step (a --log-jsonl that is a folder) leaves no TensorBoard folder.
  auto failed = test::runTiny("--train-iters 1 --tensorboard-dir " + d + "/tb --log-jsonl " + d);
  CHECK(failed.exitCode == 1);
  CHECK_FALSE(std::filesystem::exists(d + "/tb"));
}

}  // namespace
}  // namespace tpc
