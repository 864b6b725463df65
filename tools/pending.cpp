// Sub-commands whose issue has not landed yet: each says so plainly and exits 1 (after --help works).
#include <iostream>

#include "tools/cli.h"

namespace tpc {
namespace {

int pending(const std::string& name, const std::string& usage, const std::string& what, std::vector<std::string> args) {
  cli::Flags flags(name, usage);
  int rc = 0;
  // Accept anything after the command: only --help is interpreted.
  for (const std::string& a : args)
    if (a == "--help" || a == "-h") {
      std::cout << "usage: " << usage << "\n\n" << what << "\nNot available yet in this build.\n";
      return 0;
    }
  (void)flags;
  (void)rc;
  std::cerr << "tpc " << name << ": not available yet: " << what << "\n";
  return 1;
}

cli::SubcommandRegistration dumpReg(
    "dump", "print a model's IR after a compiler stage (lands with the model-file issue #3)", [](std::vector<std::string> a) {
      return pending("dump", "tpc dump MODEL.fb [--after=PASS] [--tp N]",
                     "model files (.fb/.json), autodiff and the sharding passes land with issues #3 and #5; "
                     "for .tir graphs use 'tpc opt FILE.tir --passes=... --print-after=PASS'",
                     std::move(a));
    });
cli::SubcommandRegistration runReg(
    "run", "train a model (lands with the model-file/CPU-backend issue #3)", [](std::vector<std::string> a) {
      return pending("run", "tpc run MODEL.fb [training flags]",
                     "training (model files, autodiff and the CPU backend) lands with issue #3", std::move(a));
    });
cli::SubcommandRegistration newReg(
    "new", "write a model file from a preset (lands with the GPT-builder issue #3)", [](std::vector<std::string> a) {
      return pending("new", "tpc new gpt --preset tiny|gpt2|... -o gpt.fb",
                     "the GPT builder and model files land with issue #3", std::move(a));
    });

}  // namespace
}  // namespace tpc
