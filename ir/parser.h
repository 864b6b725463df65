// Parser for the text form. Errors come back as one line: `file:line:col: error: what`.
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "ir/graph.h"
#include "ir/status.h"

namespace tpc {

// Parses one graph from `text` and verifies it. `fileName` is used in error messages.
Result<std::unique_ptr<Graph>> parseGraph(std::string_view text, const std::string& fileName = "<input>");

// Whether `text` holds nothing but blank lines and // comments: no graph (a --split-input-file chunk after a trailing
// separator, or between two in a row).
bool holdsNoGraph(std::string_view text);

// Reads and parses a .tir file ("-" reads standard input).
Result<std::unique_ptr<Graph>> parseGraphFile(const std::string& path);

// Reads a whole file or standard input ("-"); the error names the path.
Result<std::string> readTextFile(const std::string& path);

}  // namespace tpc
