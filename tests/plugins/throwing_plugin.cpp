// A pass plugin whose code throws, to see tpc name the plugin and the pass: `throwing-tp(tp=N)` (a sharding
// policy by its options) throws std::runtime_error from run(); with TPC_TEST_PLUGIN_THROW=register its
// registerPasses throws instead, with =create its factory (=create-error: it returns an error, =create-null: a null
// pass), with =info the entry point, and with =run-int run() throws
// an int. Half-way
// registrations, which must leave nothing registered: with =register-after-add registerPasses adds throwing-tp and
// then throws, with =clash it adds throwing-tp and then a pass named cse (a built-in's name).
#include <cstdlib>
#include <stdexcept>
#include <string>

#include "passes/pass_registry.h"
#include "passes/plugin.h"

namespace {

std::string throwIn() {
  const char* v = std::getenv("TPC_TEST_PLUGIN_THROW");
  return v ? v : "run";
}

class ThrowingPass final : public tpc::Pass {
 public:
  std::string_view name() const override { return "throwing-tp"; }
  tpc::Result<bool> run(tpc::Graph&) override {
    if (throwIn() == "run-int") throw 42;
    throw std::runtime_error("boom in run");
  }
};

tpc::Result<std::unique_ptr<tpc::Pass>> createThrowingPass(const tpc::PassOptions&) {
  if (throwIn() == "create") throw std::runtime_error("boom in create");
  if (throwIn() == "create-error") return tpc::makeError("tp must be even");
  if (throwIn() == "create-null") return std::unique_ptr<tpc::Pass>();
  return std::unique_ptr<tpc::Pass>(new ThrowingPass());
}

void registerPasses(tpc::PassRegistry* registry) {
  if (throwIn() == "register") throw std::runtime_error("boom in registerPasses");
  (void)registry->add({"throwing-tp", "throws from run() (a test plugin)", {{"tp", "tensor-parallel size"}},
                       createThrowingPass});
  if (throwIn() == "register-after-add") throw std::runtime_error("boom after adding throwing-tp");
  if (throwIn() == "clash") (void)registry->add({"cse", "clashes with the built-in cse", {}, createThrowingPass});
}

}  // namespace

extern "C" TpcPassPluginInfo tpcPassPluginInfo() {
  if (throwIn() == "info") throw std::runtime_error("boom in info");
  return {TPC_PASS_PLUGIN_API_VERSION, "throwing", "1.0", &registerPasses};
}
