// Fuzzes the checkpoint reader (runtime/checkpoint.h, runtime/safetensors.h). Input: u16 little-endian
// length L, then L bytes of state.json, then the bytes of model.safetensors; each is copied into its own
// exactly-sized heap buffer, so ASan catches a read past either. Oracles: a parsed state is in range; a
// parsed tensor file serializes and parses back to the same tensors; checkpointTensor reads every tensor
// back into its own layout and into one with extra (zeroed) leading rows, and refuses another shape.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <string_view>

#include "fuzz_check.h"
#include "runtime/checkpoint.h"
#include "runtime/safetensors.h"

namespace {

bool sameTensor(const tpc::HostTensor& a, const tpc::HostTensor& b) {
  return a.type() == b.type() && a.bytes() == b.bytes() && (a.bytes() == 0 || std::memcmp(a.raw(), b.raw(), a.bytes()) == 0);
}

void checkState(std::string_view text) {
  auto s = tpc::parseCheckpointState(std::string(text), "fuzz/state.json");
  if (!s) return;
  FUZZ_CHECK(s->iteration >= 0, "negative iteration accepted");
  FUZZ_CHECK(s->skippedSteps >= 0 && s->skippedSteps <= s->iteration, "skipped_steps out of [0, iteration]");
  FUZZ_CHECK(s->lossScale >= 0 && std::isfinite(s->lossScale), "a negative or non-finite loss scale accepted");
  FUZZ_CHECK(s->lossScaleGoodSteps >= 0, "negative loss_scale_good_steps accepted");
}

void checkTensors(std::string_view bytes) {
  auto f = tpc::parseSafetensors("fuzz/model.safetensors", bytes);
  if (!f) return;
  for (const auto& [name, t] : f->tensors)
    FUZZ_CHECK(f->find(name) != nullptr, "a parsed tensor cannot be found by its name: " + name);
  auto again = tpc::serializeSafetensors(*f);
  if (!again) return;  // e.g. two tensors of one name: the writer refuses them
  auto back = tpc::parseSafetensors("fuzz/again.safetensors", *again);
  FUZZ_CHECK(back.ok(), "the writer's bytes do not parse: " + (back.ok() ? std::string() : back.error()));
  FUZZ_CHECK(back->tensors.size() == f->tensors.size(), "round trip changed the tensor count");
  FUZZ_CHECK(back->metadata == f->metadata, "round trip changed the metadata");
  for (const auto& [name, t] : f->tensors) {
    const tpc::HostTensor* u = back->find(name);
    FUZZ_CHECK(u && sameTensor(t, *u), "round trip changed tensor " + name);
  }

  tpc::LoadedCheckpoint ck;
  ck.path = "fuzz/iter_0000001";
  ck.tensors = std::move(*f);
  for (const auto& [name, t] : ck.tensors.tensors) {
    if (t.numel() > (1 << 16)) continue;  // keep each run fast
    auto same = tpc::checkpointTensor(ck, name, t.shape(), t.type());
    FUZZ_CHECK(same.ok() && sameTensor(*same, t), "checkpointTensor does not read back " + name);
    if (t.shape().empty()) continue;
    tpc::Shape padded = t.shape();
    padded[0] += 2;  // vocabulary padding: the extra rows start at zero
    auto more = tpc::checkpointTensor(ck, name, t.shape(), tpc::TensorType(t.dtype(), padded));
    FUZZ_CHECK(more.ok(), "checkpointTensor refuses padding rows for " + name);
    FUZZ_CHECK(t.bytes() == 0 || std::memcmp(more->raw(), t.raw(), t.bytes()) == 0, "padded copy differs for " + name);
    for (size_t i = t.bytes(); i < more->bytes(); ++i) FUZZ_CHECK(more->raw()[i] == 0, "padding rows not zero");
    tpc::Shape other = t.shape();
    other.back() += 1;
    FUZZ_CHECK(!tpc::checkpointTensor(ck, name, other, tpc::TensorType(t.dtype(), other)).ok(),
               "checkpointTensor accepts another shape for " + name);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  size_t stateLen = data[0] | (size_t(data[1]) << 8);
  data += 2;
  size -= 2;
  if (stateLen > size) stateLen = size;
  // new[] of exactly n bytes (not a vector that may keep spare capacity), so any overread is reported.
  std::unique_ptr<char[]> state(new char[stateLen]), tensors(new char[size - stateLen]);
  std::memcpy(state.get(), data, stateLen);
  std::memcpy(tensors.get(), data + stateLen, size - stateLen);
  checkState(std::string_view(state.get(), stateLen));
  checkTensors(std::string_view(tensors.get(), size - stateLen));
  return 0;
}
