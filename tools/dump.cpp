// `tpc dump MODEL.fb|.json [--after=PASS]`: prints a model's graph after a stage of the compile pipeline
// (the forward graph with no --after). Takes the same training flags as `tpc run`.
#include <iostream>

#include "frontend/model_file.h"
#include "ir/printer.h"
#include "passes/pipeline.h"
#include "tools/cli.h"
#include "tools/compile_pipeline.h"
#include "tools/train_flags.h"

namespace tpc {
namespace {

int runDump(std::vector<std::string> args) {
  cli::Flags flags("dump", "tpc dump MODEL.fb|MODEL.json [--after=PASS] [training flags]");
  flags.value("after", "print the graph after this pass of the pipeline (default: the forward graph)")
      .value("passes", "the pipeline to run instead of the standard one")
      .toggle("print-pipeline", "print the pipeline that would run and exit");
  cli::declareTrainingFlags(flags);
  int rc = 0;
  if (!flags.parse(args, rc)) return rc;
  if (flags.positional().size() != 1) return cli::fail("dump", "expected one model file (.fb or .json)");
  auto model = loadModelFile(flags.positional()[0]);
  if (!model) return cli::fail("dump", model.error());
  if (Status s = cli::applyTrainingFlags(flags, model->config); !s.ok()) return cli::fail("dump", s.error());
  if (Status s = validateTrainConfig(model->config); !s.ok()) return cli::fail("dump", s.error());
  if (Status s = matchBatchShape(*model, flags.positional()[0]); !s.ok()) return cli::fail("dump", s.error());
  auto accum = accumulationSteps(model->config);
  if (!accum) return cli::fail("dump", accum.error());
  std::string pipeline = flags.has("passes") ? flags.get("passes") : standardPipeline(*model, *accum);
  if (flags.on("print-pipeline")) {
    std::cout << pipeline << "\n";
    return 0;
  }
  std::string after = flags.get("after");
  if (after.empty()) {
    std::cout << printGraph(*model->forward);
    return 0;
  }
  auto entries = parsePipeline(pipeline);
  if (!entries) return cli::fail("dump", entries.error());
  // Run the pipeline up to and including the first pass named `after`.
  std::vector<PipelineEntry> prefix;
  for (const PipelineEntry& e : *entries) {
    prefix.push_back(e);
    if (e.name == after) break;
  }
  if (prefix.back().name != after) {
    std::string names;
    for (const PipelineEntry& e : *entries) names += (names.empty() ? "" : ", ") + e.name;
    return cli::fail("dump", "--after=" + after + ": not a pass of the pipeline (" + names + ")");
  }
  PassManager pm;
  if (Status s = pm.addEntries(prefix); !s.ok()) return cli::fail("dump", s.error());
  if (Status s = pm.run(*model->forward); !s.ok()) return cli::fail("dump", s.error());
  std::cout << printGraph(*model->forward);
  return 0;
}

cli::SubcommandRegistration reg("dump", "print a model's graph after a stage of the compile pipeline", runDump);

}  // namespace
}  // namespace tpc
