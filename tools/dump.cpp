// `tpc dump MODEL.fb|.json [--after=PASS]`: prints a model's forward graph, or the graph after a pass.
#include <iostream>

#include "frontend/model_file.h"
#include "ir/printer.h"
#include "passes/pipeline.h"
#include "tools/cli.h"

namespace tpc {
namespace {

int runDump(std::vector<std::string> args) {
  cli::Flags flags("dump", "tpc dump MODEL.fb|MODEL.json [--after=PASS]");
  flags.value("after", "run this registered pass on the forward graph and print its result");
  int rc = 0;
  if (!flags.parse(args, rc)) return rc;
  if (flags.positional().size() != 1) return cli::fail("dump", "expected one model file (.fb or .json)");
  // Passes that belong to the compile pipeline but are not in this build say so instead of failing oddly.
  PassRegistry& registry = PassRegistry::global();
  std::string after = flags.get("after");
  if (!after.empty() && !registry.find(after))
    return cli::fail("dump", "--after=" + after + ": no such pass in this build (known: " + registry.knownNames() +
                                 "); autodiff and the sharding passes land with issues #3 and #5");
  auto model = loadModelFile(flags.positional()[0]);
  if (!model) return cli::fail("dump", model.error());
  if (!after.empty()) {
    PassManager pm;
    if (Status s = pm.addPipeline(after, registry); !s.ok()) return cli::fail("dump", s.error());
    if (Status s = pm.run(*model->forward); !s.ok()) return cli::fail("dump", s.error());
  }
  std::cout << printGraph(*model->forward);
  return 0;
}

cli::SubcommandRegistration reg("dump", "print a model file's forward graph (optionally after a pass)", runDump);

}  // namespace
}  // namespace tpc
