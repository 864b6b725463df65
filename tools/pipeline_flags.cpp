// --pass-plugin and --sharding-policy for the sub-commands that compile a training step.
#include "tools/pipeline_flags.h"

#include "passes/plugin.h"

namespace tpc::cli {

void declarePipelineFlags(Flags& flags) {
  flags.list("pass-plugin", "load passes from this shared library (runs its code)")
      .value("sharding-policy", "the pass that annotates the tp placements (a built-in or a plugin's; it gets tp=N)",
             "megatron-tp");
}

Result<std::string> applyPipelineFlags(const Flags& flags, const TrainConfig& config, PassRegistry& registry) {
  for (const std::string& plugin : flags.getList("pass-plugin")) TPC_TRY(loadPassPlugin(plugin, registry));
  std::string policy = flags.get("sharding-policy");
  const PassInfo* info = registry.find(policy);
  if (!info)
    return makeError("--sharding-policy=", policy, ": no pass of that name is registered (known: ", registry.knownNames(),
                     "); load the plugin that defines it with --pass-plugin=lib.so");
  bool takesTp = false;
  for (const PassOptionSpec& o : info->options) takesTp |= o.name == "tp";
  if (!takesTp)
    return makeError("--sharding-policy=", policy, ": pass '", policy, "' has no option tp, so it is not a sharding policy "
                     "(a policy takes tp=N: see examples/sharding-plugin)");
  if (flags.has("sharding-policy") && config.tp <= 1 && !config.sp)
    return makeError("--sharding-policy=", policy, " needs --tp N with N > 1 (the policy places tensors on mesh axis tp)");
  return policy;
}

}  // namespace tpc::cli
