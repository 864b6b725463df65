// Model files (frontend/model.fbs): the forward graph, its loss, the training config and optionally the
// architecture record. Binary `.fb` (flatbuffers) or the same schema as `.json`; chosen by extension.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "frontend/architecture.h"
#include "frontend/train_config.h"
#include "ir/graph.h"
#include "ir/status.h"

namespace tpc {

inline constexpr uint32_t kModelFormatVersion = 1;

struct ModelFile {
  std::unique_ptr<Graph> forward;  // unsharded, no placements or mesh
  std::string lossOutput;          // the name of the output that is the loss
  TrainConfig config;
  std::optional<GptConfig> gpt;    // set when the graph was built by models/gpt
};

// Reads, verifies and validates a model file; the graph is rebuilt through Graph::create so that shape
// errors are caught. Every error is one line: `PATH: error: what (naming the field)`.
Result<ModelFile> loadModelFile(const std::string& path);
// The same from bytes already in memory; `fileName` (whose extension picks the format) is for messages.
Result<ModelFile> loadModelFromBytes(std::string_view bytes, const std::string& fileName);

// Writes `.fb` or `.json` (by extension) to PATH.tmp, then renames it to PATH.
Status saveModelFile(const ModelFile& model, const std::string& path);
// The file's bytes in either format. JSON cannot hold a string that is not UTF-8: the error names its field (no file).
Result<std::string> serializeModel(const ModelFile& model, bool json);

// A preset (models/presets/*.json, schema table Preset): an architecture and a training config.
struct ModelPreset {
  GptConfig gpt;
  TrainConfig config;
};
Result<ModelPreset> parsePresetJson(std::string_view json, const std::string& fileName);

}  // namespace tpc
