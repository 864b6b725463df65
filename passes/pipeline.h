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
  int column = 1;  // in the pipeline string, for errors
};

// Parses the pipeline text; errors read `--passes:1:COL: error: what`.
Result<std::vector<PipelineEntry>> parsePipeline(const std::string& text);

struct PipelineConfig {
  bool verifyEach = true;            // run the verifier after every pass
  std::set<std::string> printAfter;  // pass names whose output is dumped
  bool printAfterAll = false;
  llvm::raw_ostream* dumpStream = nullptr;  // where dumps go (default: stderr)
};

class PassManager {
 public:
  explicit PassManager(PipelineConfig config = {}) : config_(std::move(config)) {}
  // Builds the passes of `text` from `registry`; unknown passes and options are errors.
  Status addPipeline(const std::string& text, const PassRegistry& registry = PassRegistry::global());
  // The same from entries already parsed (e.g. a prefix of a pipeline).
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
