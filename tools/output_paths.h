// Output files checked before a command does any work: writable, and not one of the command's inputs (writing
// a memory-mapped dataset or checkpoint under the command would crash it and destroy the input).
#pragma once

#include <filesystem>
#include <string>

#include "ir/status.h"

namespace tpc::cli {

// Whether two paths name one file: the same file where both exist, else the same absolute normal path.
bool sameFile(const std::filesystem::path& a, const std::filesystem::path& b);

// Whether `file` is inside the folder `dir` (at any depth).
bool insideFolder(const std::filesystem::path& file, const std::filesystem::path& dir);
// `file`'s path relative to `dir` when it is inside it ("iter_0000002/state.json"), else empty.
std::filesystem::path pathInFolder(const std::filesystem::path& file, const std::filesystem::path& dir);

// An output file checked before anything is written: not empty, not a folder, its folder existing and writable.
// `flag` names it in the error as the user typed it ("-o", "--log-jsonl").
Status checkOutputFile(const std::string& flag, const std::string& path);

}  // namespace tpc::cli
