// Loading pass plugins with dlopen.
#include "passes/plugin.h"

#include <dlfcn.h>
#include <sys/stat.h>

#include <exception>
#include <optional>

#include "passes/pass_registry.h"

namespace tpc {

Status loadPassPlugin(const std::string& path, PassRegistry& registry) {
  struct stat st{};
  if (stat(path.c_str(), &st) != 0) return makeError(path, ": error: pass plugin not found (check the --pass-plugin path)");
  if (!S_ISREG(st.st_mode)) return makeError(path, ": error: pass plugin is not a regular file");
  // The same file named twice (or by another path) is the one library dlopen already holds: its passes are
  // registered, and registering them again would clash with themselves. Another file is another library.
  const std::string id = cat(st.st_dev, ":", st.st_ino);
  if (registry.hasPluginLoaded(id)) return {};
  // RTLD_NOW: unresolved symbols are reported here, not as a crash later. Never dlclosed: passes
  // registered by the plugin live as long as the registry.
  // A bare name is the file found above (stat saw it in the current folder), not a library search: dlopen
  // reads a name without a slash as one.
  const std::string file = path.find('/') == std::string::npos ? "./" + path : path;
  void* handle = dlopen(file.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!handle) {
    std::string why = dlerror();
    return makeError(path, ": error: cannot load pass plugin: ", why);
  }
  using EntryFn = TpcPassPluginInfo (*)();
  auto entry = reinterpret_cast<EntryFn>(dlsym(handle, TPC_PASS_PLUGIN_ENTRY));
  if (!entry) {
    dlclose(handle);
    return makeError(path, ": error: not a tpc pass plugin (it does not export `extern \"C\" ", TPC_PASS_PLUGIN_ENTRY, "()`)");
  }
  TpcPassPluginInfo info{};
  try {  // plugin code, like registerPasses below: what it throws is said to be the plugin's
    info = entry();
  } catch (const std::exception& e) {
    return makeError(path, ": error: pass plugin threw in ", TPC_PASS_PLUGIN_ENTRY, "(): ", e.what());
  } catch (...) {
    return makeError(path, ": error: pass plugin threw in ", TPC_PASS_PLUGIN_ENTRY, "(): an exception that is not a std::exception");
  }
  // Copied now: the plugin's strings live in its image, which dlclose unmaps.
  std::string pluginName = info.pluginName ? info.pluginName : "?";
  if (info.apiVersion != TPC_PASS_PLUGIN_API_VERSION) {
    dlclose(handle);
    return makeError(path, ": error: pass plugin '", pluginName, "' was built for plugin API version ",
                     info.apiVersion, ", but this tpc has API version ", TPC_PASS_PLUGIN_API_VERSION,
                     "; rebuild the plugin against this tpc's headers");
  }
  if (!info.registerPasses) {
    dlclose(handle);
    return makeError(path, ": error: pass plugin '", pluginName, "' has no registerPasses function");
  }
  registry.beginOrigin(cat("plugin ", path));
  // Plugin code may throw; tpc is not its caller's catch-all, so say whose code it was.
  std::optional<std::string> threw;
  try {
    info.registerPasses(&registry);
  } catch (const std::exception& e) {
    threw = e.what();
  } catch (...) {
    threw = "an exception that is not a std::exception";
  }
  // A plugin that failed registers nothing: the passes it added before it threw (or before an add() it made was
  // refused) are removed, so that no pass of a half-registered plugin can be run, nor clash with a good plugin.
  // The library stays loaded, as a good plugin's does (never dlclosed).
  Status s = registry.endOrigin(threw.has_value());
  if (threw)
    return makeError(path, ": error: pass plugin '", pluginName, "' threw in registerPasses: ", *threw);
  if (s.ok()) registry.notePluginLoaded(id);
  return s;
}

}  // namespace tpc
