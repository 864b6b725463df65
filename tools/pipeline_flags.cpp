// --pass-plugin and --sharding-policy for the sub-commands that compile a training step.
#include "tools/pipeline_flags.h"

#include <iostream>
#include <set>

#include "passes/plugin.h"
#include "tools/train_flags.h"

namespace tpc::cli {

namespace {

const char* const kDefaultPolicy = "megatron-tp";

std::string divisorsOf(int64_t n) {
  std::string out;
  for (int64_t d = 1; d <= n; ++d)
    if (n % d == 0) out += cat(out.empty() ? "" : ", ", d);
  return out;
}

}  // namespace

void declarePipelineFlags(Flags& flags) {
  flags.list("pass-plugin", "load passes from this shared library (runs its code)")
      .value("sharding-policy", "the pass that annotates the tp placements (a built-in or a plugin's; it gets tp=N)",
             kDefaultPolicy);
}

Result<std::string> applyPipelineFlags(const Flags& flags, const TrainConfig& config, PassRegistry& registry,
                                       const GptConfig* gpt) {
  std::string policy = flags.get("sharding-policy");
  for (const std::string& plugin : flags.getList("pass-plugin")) {
    std::set<std::string> before;
    for (const PassInfo* p : registry.all()) before.insert(p->name);
    TPC_TRY(loadPassPlugin(plugin, registry));
    // Without a pass list of the user's (`tpc dump --passes`), a plugin's pass runs only as the policy: say so where
    // none of the plugin's is, rather than load it for nothing.
    std::string added;
    bool policyAmong = false;
    for (const PassInfo* p : registry.all())
      if (!before.count(p->name)) added += cat(added.empty() ? "" : ", ", p->name), policyAmong |= p->name == policy;
    if (!added.empty() && !policyAmong && !flags.has("passes"))  // (a library named twice adds nothing the second time)
      std::cerr << "tpc " << flags.command() << ": warning: --pass-plugin " << plugin << " registers " << added
                << ", but none is the --sharding-policy (" << policy << "), the one place a plugin's pass runs here: "
                << "the plugin does nothing; give --sharding-policy NAME --tp N" << std::endl;
  }
  const PassInfo* info = registry.find(policy);
  if (!info)
    return makeError("--sharding-policy=", policy, ": no pass of that name is registered (known: ", registry.knownNames(),
                     "); load the plugin that defines it with --pass-plugin=lib.so");
  bool takesTp = false;
  for (const PassOptionSpec& o : info->options) takesTp |= o.name == "tp";
  if (!takesTp)
    return makeError("--sharding-policy=", policy, ": pass '", policy, "' has no option tp, so it is not a sharding policy "
                     "(a policy takes tp=N: see examples/sharding-plugin)");
  // At tp 1 no policy runs (--sp too does nothing there). Naming the default then changes nothing, as in scripts
  // that always pass it; naming another would be silently ignored, so it is refused.
  if (policy != kDefaultPolicy && config.tp <= 1)
    return makeError("--sharding-policy=", policy, " needs --tp N with N > 1 (the policy places tensors on mesh axis tp)");
  if (gpt) {
    const ConfigFieldName name = flagOrFieldName(flags);
    const std::string tp = cat(name("tensor_model_parallel_size"), "=", config.tp);
    if (policy == "megatron-tp" && config.tp > 1 && gpt->heads % config.tp != 0)
      return makeError(tp, " does not divide the model's ", gpt->heads, " attention heads (arch.heads), which megatron-tp "
                       "splits over the tp ranks; use a tp of ", divisorsOf(gpt->heads));
    if (config.sp && config.tp > 1 && config.seqLength % config.tp != 0)
      return makeError("--sp splits the sequence over the tp ranks: ", name("seq_length"), "=", config.seqLength,
                       " is not a multiple of ", tp, "; give a --seq-length that is");
  }
  return policy;
}

}  // namespace tpc::cli
