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

cli::SubcommandRegistration runReg(
    "run", "train a model (lands with the model-file/CPU-backend issue #3)", [](std::vector<std::string> a) {
      return pending("run", "tpc run MODEL.fb [training flags]",
                     "training (model files, autodiff and the CPU backend) lands with issue #3", std::move(a));
    });
}  // namespace
}  // namespace tpc
