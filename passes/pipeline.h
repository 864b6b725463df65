// Pipelines: parsing `--passes='cse,dce,name(key=value)'` and running passes with the verifier between
// them and optional dumps after each.
#pragma once

#include <memory>
#include <set>
#include <string>
#include <vector>

#include "passes/pass_registry.h"
#include "llvm/Support/raw_ostream.h"

namespace tpc {

struct PipelineEntry {
  std::string name;
  PassOptions options;
  int column = 1;      // in the pipeline string, for errors
  std::string source;  // where that string came from (parsePipeline's `source`)
};

// Parses the pipeline text. `source` names where the text came from, for the place in errors: "--passes" (the
// flag a user gave it with) makes them read `--passes:1:COL: error: what`; "" is a pipeline tpc built itself,
// whose errors say what alone (a user never saw its text, so a column in it would mean nothing to them).
Result<std::vector<PipelineEntry>> parsePipeline(const std::string& text, const std::string& source);

struct PipelineConfig {
  bool verifyEach = true;            // run the verifier after every pass
  std::set<std::string> printAfter;  // pass names whose output is dumped
  bool printAfterAll = false;
  llvm::raw_ostream* dumpStream = nullptr;  // where dumps go (default: stderr)
};

class PassManager {
 public:
  explicit PassManager(PipelineConfig config = {}) : config_(std::move(config)) {}
  // Builds the passes of `text` from `registry`; unknown passes and options are errors, placed in `source` as
  // parsePipeline's are.
  Status addPipeline(const std::string& text, const std::string& source,
                     const PassRegistry& registry = PassRegistry::global());
  // The same from entries already parsed (e.g. a prefix of a pipeline); errors are placed in their source.
  Status addEntries(const std::vector<PipelineEntry>& entries, const PassRegistry& registry = PassRegistry::global());
  void addPass(std::unique_ptr<Pass> p) { passes_.push_back({std::move(p), ""}); }
  size_t size() const { return passes_.size(); }
  // Runs every pass in order; stops at the first error. An exception a pass throws is an error naming the
  // pass (and its plugin).
  Status run(Graph& g);

 private:
  struct Entry {
    std::unique_ptr<Pass> pass;
    std::string origin;  // "plugin PATH" for a plugin's pass, whose errors name it; "" for tpc's own
  };
  PipelineConfig config_;
  std::vector<Entry> passes_;
};

}  // namespace tpc
