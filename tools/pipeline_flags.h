// The flags that change what the compile pipeline of `tpc run` and `tpc dump` may contain: pass plugins
// (--pass-plugin) and the tensor-parallel sharding policy (--sharding-policy, megatron-tp by default).
#pragma once

#include <string>

#include "frontend/architecture.h"
#include "frontend/train_config.h"
#include "passes/pass_registry.h"
#include "tools/cli.h"

namespace tpc::cli {

// Declares --pass-plugin (repeatable) and --sharding-policy.
void declarePipelineFlags(Flags& flags);
// Loads every --pass-plugin into `registry`, then checks --sharding-policy: a registered pass, given with
// --tp N > 1 (or --sp) unless it is the default (megatron-tp), which tp 1 simply does not run. With the model's arch block (`gpt`), also what the passes would refuse later, named by
// flag: a tp that does not divide megatron-tp's attention heads, a sequence that --sp cannot split over tp.
// Returns the policy's name; an error names the flag, the value and the fix.
Result<std::string> applyPipelineFlags(const Flags& flags, const TrainConfig& config, PassRegistry& registry,
                                       const GptConfig* gpt = nullptr);

}  // namespace tpc::cli
