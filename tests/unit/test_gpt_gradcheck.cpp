// The whole 2-layer GPT (as models/gpt builds it: padded vocab sliced before the loss, tied head,
// dropout on and off) against finite differences in fp64 on the CPU reference executor.
#include <catch2/catch.hpp>

#include "gradcheck.h"
#include "models/gpt.h"

namespace tpc {
namespace {

ModelFile smallGpt(double dropout) {
  GptConfig gpt;
  gpt.layers = 2;
  gpt.hidden = 16;
  gpt.heads = 2;
  gpt.vocab = 50;  // padded to 128: the slice before the loss is exercised
  gpt.positions = 8;
  gpt.hiddenDropout = dropout;
  gpt.attentionDropout = dropout;
  TrainConfig config;
  config.microBatch = 2;
  config.globalBatch = 2;
  config.seqLength = 6;  // shorter than the position table: wpe is sliced
  auto m = buildGpt(gpt, config);
  REQUIRE(m.ok());
  return std::move(m).value();
}

bool isLayerNormGain(const std::string& name) {
  return name.find("ln_") != std::string::npos && name.find(".weight") != std::string::npos;
}

TEST_CASE("gradcheck: a 2-layer GPT's gradients match finite differences (fp64)", "[autodiff][cpu][gpt]") {
  ModelFile m = smallGpt(0.0);
  auto r = test::gradcheckGraph(*m.forward, m.lossOutput, 50, 4, 11, isLayerNormGain);
  INFO("worst: " << r.worst);
  CHECK(r.checked == 4 * static_cast<int>(m.forward->params().size()));
  CHECK(r.worstRelError < 1e-6);
}

TEST_CASE("gradcheck: a 2-layer GPT with dropout matches finite differences (fp64)", "[autodiff][cpu][gpt]") {
  // The masks depend only on (seed, step, key, index), so the perturbed runs draw the same masks.
  ModelFile m = smallGpt(0.2);
  auto r = test::gradcheckGraph(*m.forward, m.lossOutput, 50, 3, 12, isLayerNormGain);
  INFO("worst: " << r.worst);
  CHECK(r.worstRelError < 1e-6);
}

}  // namespace
}  // namespace tpc
