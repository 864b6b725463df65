// The pass registry and pass options.
#include "passes/pass_registry.h"

#include <cerrno>
#include <cstdlib>

namespace tpc {

Result<int64_t> PassOptions::getInt(const std::string& key, int64_t def) const {
  auto it = values_.find(key);
  if (it == values_.end()) return def;
  char* end = nullptr;
  errno = 0;
  long long v = std::strtoll(it->second.c_str(), &end, 10);
  if (it->second.empty() || *end != '\0' || errno == ERANGE)
    return makeError("pass '", pass_, "': option ", key, "=", it->second, " is not an integer");
  return static_cast<int64_t>(v);
}

Result<double> PassOptions::getFloat(const std::string& key, double def) const {
  auto it = values_.find(key);
  if (it == values_.end()) return def;
  char* end = nullptr;
  double v = std::strtod(it->second.c_str(), &end);
  if (it->second.empty() || *end != '\0') return makeError("pass '", pass_, "': option ", key, "=", it->second, " is not a number");
  return v;
}

Result<bool> PassOptions::getBool(const std::string& key, bool def) const {
  auto it = values_.find(key);
  if (it == values_.end()) return def;
  if (it->second == "true" || it->second == "1") return true;
  if (it->second == "false" || it->second == "0") return false;
  return makeError("pass '", pass_, "': option ", key, "=", it->second, " is not true or false");
}

std::string PassOptions::getString(const std::string& key, const std::string& def) const {
  auto it = values_.find(key);
  return it == values_.end() ? def : it->second;
}

PassRegistry& PassRegistry::global() {
  static PassRegistry* r = [] {
    auto* reg = new PassRegistry();
    registerBuiltinPasses(*reg);
    return reg;
  }();
  return *r;
}

Status PassRegistry::add(PassInfo info) {
  Status s;
  if (info.name.empty() || !info.factory) {
    s = makeError(origin_, ": a pass was registered without a name or a factory");
  } else if (auto it = passes_.find(info.name); it != passes_.end()) {
    s = makeError(origin_, ": pass '", info.name, "' is already registered by ", it->second.origin);
  } else {
    std::string name = info.name;
    passes_.emplace(name, Entry{std::move(info), origin_});
    originAdded_.push_back(std::move(name));
  }
  if (!s.ok() && !originError_) originError_ = s.error();
  return s;
}

void PassRegistry::beginOrigin(std::string origin) {
  origin_ = std::move(origin);
  originError_.reset();
  originAdded_.clear();
}

Status PassRegistry::endOrigin(bool failed) {
  origin_ = "built-in";
  std::vector<std::string> added = std::move(originAdded_);
  originAdded_.clear();
  std::optional<std::string> error = std::move(originError_);
  originError_.reset();
  if (!failed && !error) return {};
  for (const std::string& name : added) passes_.erase(name);
  if (error) return Error{*error};
  return {};
}

const PassInfo* PassRegistry::find(const std::string& name) const {
  auto it = passes_.find(name);
  return it == passes_.end() ? nullptr : &it->second.info;
}

std::string PassRegistry::originOf(const std::string& name) const {
  auto it = passes_.find(name);
  return it == passes_.end() ? std::string() : it->second.origin;
}

std::vector<const PassInfo*> PassRegistry::all() const {
  std::vector<const PassInfo*> out;
  for (const auto& [name, e] : passes_) out.push_back(&e.info);
  return out;
}

std::string PassRegistry::knownNames() const {
  std::string s;
  for (const auto& [name, e] : passes_) s += (s.empty() ? "" : ", ") + name;
  return s;
}

}  // namespace tpc
