// safetensors (Hugging Face's tensor file format): an 8-byte little-endian header length, a JSON header
// {"name": {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]}, "__metadata__": {str: str}},
// then the tensors' bytes. Used for checkpoints and for the Hugging Face GPT-2 layout.
// The reader checks everything a crafted file could lie about (header length, offsets, overlaps, dtype
// sizes against shapes) before it allocates or copies anything.
#pragma once

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "ir/file_io.h"
#include "ir/status.h"
#include "runtime/host_tensor.h"

namespace tpc {

struct SafetensorsFile {
  std::vector<std::pair<std::string, HostTensor>> tensors;  // in file order
  std::map<std::string, std::string> metadata;

  const HostTensor* find(const std::string& name) const;
};

// The file's bytes (header + data). Tensor names must be unique.
Result<std::string> serializeSafetensors(const SafetensorsFile& file);
// Writes `file` to `path` (a temporary name, then rename).
Status writeSafetensors(const std::string& path, const SafetensorsFile& file);
// Writes `file` to a temporary of `commit`'s for `path`: it replaces `path` with the commit's other files.
Status writeSafetensors(FileCommit& commit, const std::string& path, const SafetensorsFile& file);
// Parses bytes; errors name `path` and what is wrong.
Result<SafetensorsFile> parseSafetensors(const std::string& path, std::string_view bytes);
Result<SafetensorsFile> readSafetensors(const std::string& path);

}  // namespace tpc
