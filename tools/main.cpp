// tpc: the command line. Sub-commands live one per file in tools/ and register themselves.
#include <exception>
#include <iostream>
#include <new>
#include <string>
#include <vector>

#include "runtime/backend_select.h"
#include "tools/cli.h"
#include "tpc/version.h"

namespace {

void printUsage() {
  std::cout << "tpc " TPC_VERSION ": a graph-compiled training runtime\n\n"
            << "usage: tpc <command> [options]   (tpc <command> --help for its options)\n\ncommands:\n";
  for (const auto& [name, sc] : tpc::cli::subcommands()) {
    std::string left = "  " + name;
    left.resize(14, ' ');
    std::cout << left << sc.summary << "\n";
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  // `tpc help run` is `tpc run --help`.
  if (args.size() == 2 && args[0] == "help" && tpc::cli::subcommands().count(args[1])) args = {args[1], "--help"};
  if (args.empty() || args[0] == "--help" || args[0] == "-h" || args[0] == "help") {
    printUsage();
    return args.empty() ? 1 : 0;
  }
  if (args[0] == "--version") {
    std::cout << "tpc " TPC_VERSION "\n" << tpc::backendSummary() << "\n";
    return 0;
  }
  auto it = tpc::cli::subcommands().find(args[0]);
  if (it == tpc::cli::subcommands().end()) {
    std::cerr << "tpc: error: unknown command '" << args[0] << "' (run 'tpc --help' for the list)\n";
    return 1;
  }
  // What escapes a sub-command is a host allocation that failed (an activations plan larger than memory on the
  // CPU backend) or a bug: one error line, exit 1, never an abort with a stack trace.
  try {
    return it->second.run(std::vector<std::string>(args.begin() + 1, args.end()));
  } catch (const std::bad_alloc&) {
    std::cerr << "tpc " << args[0] << ": error: out of host memory (lower --micro-batch-size or --seq-length; "
              << "'tpc dump MODEL --memory' prints the planned peak)\n";
  } catch (const std::exception& e) {
    std::cerr << "tpc " << args[0] << ": error: " << e.what() << "\n";
  }
  return 1;
}
