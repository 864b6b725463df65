// The one place where tpc's own passes are registered (STYLE.md #4: the driver is a list of registrations).
#include "passes/builtin_passes.h"

#include "passes/pass_registry.h"

namespace tpc {

namespace {

// Wraps an option-less factory.
template <std::unique_ptr<Pass> (*Create)()>
Result<std::unique_ptr<Pass>> plain(const PassOptions&) {
  return Create();
}

}  // namespace

void registerBuiltinPasses(PassRegistry& r) {
  (void)r.add({"cse", "merges nodes that compute the same thing (op, operands, attributes, types, placements)", {},
               plain<createCSEPass>});
  (void)r.add({"dce", "removes nodes whose results no graph output needs", {}, plain<createDCEPass>});
}

}  // namespace tpc
