// What `tpc CMD` says after "unknown option": tpc's spelling of a Megatron-LM flag (scripts written for
// Megatron-LM are the usual source of one), or the sub-command's own flag closest to a typo.
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace tpc::cli {

// `name` is the option as typed without its dashes, `value` the word given with it (--x=V or --x V), `known`
// the flags of sub-command `command`. Returns the rest of the error line after "unknown option '--name'"
// (e.g. "; did you mean --tp 2? ..."), or "" when there is nothing to suggest. Only flags of `command` are
// suggested, except for the model's sizes, which only `tpc new` sets.
std::string unknownOptionHint(const std::string& command, const std::string& name, const std::optional<std::string>& value,
                              const std::vector<std::string>& known);

}  // namespace tpc::cli
