// An example sharding strategy as a tpc pass plugin: `mlp-tp(tp=N)`, tensor parallelism of the GPT's MLPs
// only (fc1 split by column, fc2 by row); attention, the embeddings and the LayerNorms stay replicated.
// A policy pass only annotates placements on params: the engine (propagation + partition) gives every other
// value its placement, the local shapes and the collectives, forward and backward. Build it like this
// file's CMakeLists.txt does, then:
//   tpc run model.fb --tp 2 --pass-plugin ./libtpc_mlp_tp.so --sharding-policy mlp-tp
#include <regex>

#include "passes/pass_registry.h"
#include "passes/plugin.h"
#include "passes/sharding/sharding.h"

namespace {

const char* kPolicy = "mlp-tp";

class MlpTpPass final : public tpc::Pass {
 public:
  explicit MlpTpPass(int64_t tp) : tp_(tp) {}
  std::string_view name() const override { return kPolicy; }

  tpc::Result<bool> run(tpc::Graph& g) override {
    TPC_TRY(tpc::ensureMeshAxis(g, "tp", tp_, kPolicy));
    // h.<i>.mlp.c_fc.weight [D,F] by column, its bias [F] with it, h.<i>.mlp.c_proj.weight [F,D] by row: each
    // rank holds F/tp hidden units, fc2 yields partial sums and the engine all-reduces them.
    static const std::regex mlp(R"(h\.\d+\.mlp\.(c_fc\.weight|c_fc\.bias|c_proj\.weight))");
    int64_t split = 0;
    for (tpc::Value* p : g.params()) {
      if (!std::regex_match(p->name(), mlp)) continue;
      int64_t dim = p->name().find("c_fc.weight") != std::string::npos ? 1 : 0;
      if (p->shape()[dim] % tp_ != 0)
        return tpc::makeError(kPolicy, ": tp=", tp_, " does not divide dim ", dim, " (", p->shape()[dim], ") of tensor ",
                              p->name(), " ", p->type().str(), " on mesh axis tp");
      TPC_TRY(tpc::annotatePlacement(p, "tp", tpc::AxisPlacement::split(dim), kPolicy));
      ++split;
    }
    if (split == 0)
      return tpc::makeError(kPolicy, ": the graph has no param h.<i>.mlp.c_fc.weight: not a GPT built by tpc");
    for (tpc::Value* p : g.params())
      if (!p->placement()) TPC_TRY(tpc::annotatePlacement(p, "tp", tpc::AxisPlacement::replicated(), kPolicy));
    return true;
  }

 private:
  int64_t tp_;
};

void registerPasses(tpc::PassRegistry* registry) {
  (void)registry->add({kPolicy,
                       "tensor parallelism of the GPT's MLPs only: fc1 by column, fc2 by row (example sharding plugin)",
                       {{"tp", "tensor-parallel size (mesh axis tp)"}},
                       [](const tpc::PassOptions& o) -> tpc::Result<std::unique_ptr<tpc::Pass>> {
                         TPC_ASSIGN(int64_t tp, o.getInt("tp", 0));
                         if (tp < 1)
                           return tpc::makeError("pass 'mlp-tp': option tp=", tp, " must be >= 1 (e.g. mlp-tp(tp=2))");
                         return std::unique_ptr<tpc::Pass>(new MlpTpPass(tp));
                       }});
}

}  // namespace

extern "C" TpcPassPluginInfo tpcPassPluginInfo() {
  return {TPC_PASS_PLUGIN_API_VERSION, kPolicy, "1.0", &registerPasses};
}
