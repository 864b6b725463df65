// The pass interface (STYLE.md #4): a small class with name() and run(Graph&) -> changed?
// Options come from the pipeline string, e.g. --passes='megatron-tp(tp=4),partition'.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <string_view>

#include "ir/graph.h"
#include "ir/status.h"

namespace tpc {

class Pass {
 public:
  virtual ~Pass() = default;
  virtual std::string_view name() const = 0;
  // Rewrites `g` in place; returns whether anything changed, or a user-facing error.
  virtual Result<bool> run(Graph& g) = 0;
};

// key=value options of one pass in a pipeline; typed getters report bad values naming the pass and key.
class PassOptions {
 public:
  PassOptions() = default;
  explicit PassOptions(std::string pass) : pass_(std::move(pass)) {}
  void set(const std::string& key, std::string value) { values_[key] = std::move(value); }
  bool has(const std::string& key) const { return values_.count(key) != 0; }
  const std::map<std::string, std::string>& values() const { return values_; }

  Result<int64_t> getInt(const std::string& key, int64_t def) const;
  Result<double> getFloat(const std::string& key, double def) const;
  Result<bool> getBool(const std::string& key, bool def) const;
  std::string getString(const std::string& key, const std::string& def) const;

 private:
  std::string pass_;
  std::map<std::string, std::string> values_;
};

}  // namespace tpc
