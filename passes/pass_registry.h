// The one registry mapping pass names to factories. Built-in passes register in builtin_passes.cpp;
// plugins register through the C entry point in plugin.h.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "passes/pass.h"

namespace tpc {

struct PassOptionSpec {
  std::string name;
  std::string help;
};

struct PassInfo {
  std::string name;
  std::string description;
  std::vector<PassOptionSpec> options;  // the keys the pass accepts; others are refused
  std::function<Result<std::unique_ptr<Pass>>(const PassOptions&)> factory;
};

class PassRegistry {
 public:
  // The process-wide registry, with the built-in passes already registered.
  static PassRegistry& global();

  // Registers a pass; a second pass of the same name is an error naming both origins.
  Status add(PassInfo info);
  const PassInfo* find(const std::string& name) const;
  // Who registered `name`: "built-in" or "plugin PATH" ("" when no such pass).
  std::string originOf(const std::string& name) const;
  std::vector<const PassInfo*> all() const;
  std::string knownNames() const;  // "cse, dce, ..."

  // A plugin registers between these two, all or nothing: failed add()s are remembered so the loader can report
  // them, and endOrigin() then removes every pass the origin added, as it does when the loader says the plugin
  // failed (`failed`: its registerPasses threw). A plugin that fails leaves the registry as it found it.
  void beginOrigin(std::string origin);
  Status endOrigin(bool failed = false);

  // Plugin libraries whose passes this registry holds, by identity (device:inode, as dlopen tells
  // libraries apart), so that loading one again registers nothing twice.
  void notePluginLoaded(const std::string& id) { pluginsLoaded_.insert(id); }
  bool hasPluginLoaded(const std::string& id) const { return pluginsLoaded_.count(id) != 0; }

 private:
  std::string origin_ = "built-in";
  std::optional<std::string> originError_;
  std::vector<std::string> originAdded_;  // the passes added since beginOrigin, removed if the origin fails
  struct Entry {
    PassInfo info;
    std::string origin;
  };
  std::map<std::string, Entry> passes_;
  std::set<std::string> pluginsLoaded_;
};

// Registers tpc's own passes (called once by PassRegistry::global()).
void registerBuiltinPasses(PassRegistry& r);

}  // namespace tpc
