// Where tpc finds its data (vocabularies, corpora): see dataDir().
#pragma once

#include <string>

#include "ir/status.h"

namespace tpc {

// The data folder: $TPC_DATA_DIR if set; else <dir of the executable>/../../data or
// <dir of the executable>/../data, whichever exists first (a build tree inside the source tree, or an
// install); else the source tree's data/ compiled in at build time.
std::string dataDir();

// dataDir()/relPath if that file exists, else an error naming the path, saying what the file is (what),
// and how to get it (scripts/fetch_data.sh).
Result<std::string> requireDataFile(const std::string& relPath, const std::string& what);

}  // namespace tpc
