// Pass plugins: a shared library exposing `extern "C" TpcPassPluginInfo tpcPassPluginInfo()`, which
// returns the API version it was built against and a function that registers its passes.
// A plugin is code: it runs only when named by --pass-plugin.
#pragma once

#include <cstdint>
#include <string>

#include "ir/status.h"

namespace tpc {
class PassRegistry;
}

// Bump when Graph, Pass or PassRegistry change in a way that breaks built plugins.
#define TPC_PASS_PLUGIN_API_VERSION 1

extern "C" {
struct TpcPassPluginInfo {
  uint32_t apiVersion;  // TPC_PASS_PLUGIN_API_VERSION at the plugin's build
  const char* pluginName;
  const char* pluginVersion;
  void (*registerPasses)(tpc::PassRegistry* registry);
};
}

// The symbol a plugin exports.
#define TPC_PASS_PLUGIN_ENTRY "tpcPassPluginInfo"

namespace tpc {

// dlopens `path`, checks its entry point and API version, and registers its passes into `registry`; a file
// already loaded into `registry` (by this or another path) is not registered again. Errors name the path and
// say why (missing file, not a plugin, other API version, name clash, an exception from registerPasses); a plugin
// that fails registers none of its passes.
Status loadPassPlugin(const std::string& path, PassRegistry& registry);

}  // namespace tpc
