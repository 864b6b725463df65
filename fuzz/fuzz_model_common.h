// The model-file oracle shared by fuzz_model_fb and fuzz_model_json: any bytes load or give an error;
// a model that loads must serialize, load back, and give the same graph text and loss output.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "frontend/model_file.h"
#include "fuzz_check.h"
#include "ir/printer.h"

inline int fuzzModelFile(const uint8_t* data, size_t size, bool json) {
  std::string_view bytes(reinterpret_cast<const char*>(data), size);
  const std::string name = json ? "fuzz.json" : "fuzz.fb";
  auto m = tpc::loadModelFromBytes(bytes, name);
  if (!m) return 0;
  auto out = tpc::serializeModel(*m, json);
  FUZZ_CHECK(out.ok(), "a loaded model does not serialize: " + out.error());
  auto back = tpc::loadModelFromBytes(*out, name);
  FUZZ_CHECK(back.ok(), "a serialized model does not load: " + back.error());
  std::string a = tpc::printGraph(*m->forward), b = tpc::printGraph(*back->forward);
  FUZZ_CHECK(a == b, "the graph changed through save and load:\n" + a + "\n---\n" + b);
  FUZZ_CHECK(m->lossOutput == back->lossOutput, "the loss output changed: " + m->lossOutput + " vs " + back->lossOutput);
  return 0;
}
