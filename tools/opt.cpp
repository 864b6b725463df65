// `tpc opt`: reads a .tir graph, runs a pass pipeline, prints the result (the pass test driver).
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <set>

#include "ir/parser.h"
#include "ir/printer.h"
#include "passes/pipeline.h"
#include "passes/plugin.h"
#include "tools/cli.h"
#include "tools/output_paths.h"
#include "ir/file_io.h"

namespace tpc {
namespace {

// Splits on lines that are exactly "// -----"; each chunk keeps its line numbers (leading blank lines).
std::vector<std::string> splitInput(const std::string& text) {
  std::vector<std::string> chunks;
  std::string cur;
  int line = 1, chunkStart = 1;
  size_t pos = 0;
  while (pos <= text.size()) {
    size_t nl = text.find('\n', pos);
    std::string l = text.substr(pos, nl == std::string::npos ? std::string::npos : nl - pos);
    if (l == "// -----") {
      chunks.push_back(cur);
      cur = std::string(line, '\n');
      chunkStart = line + 1;
    } else {
      cur += l;
      if (nl != std::string::npos) cur += "\n";
    }
    if (nl == std::string::npos) break;
    pos = nl + 1;
    ++line;
  }
  (void)chunkStart;
  chunks.push_back(cur);
  return chunks;
}

int runOpt(std::vector<std::string> args) {
  cli::Flags flags("opt", "tpc opt [FILE.tir | -] [--passes=PIPELINE] [options]");
  flags.value("passes", "the pipeline, e.g. 'cse,dce' or 'name(key=value)'")
      .list("print-after", "print the graph (to stderr) after each pass of this name")
      .toggle("print-after-all", "print the graph (to stderr) after every pass")
      .list("pass-plugin", "load passes from this shared library (runs its code)")
      .toggle("no-verify", "do not run the verifier between passes")
      .toggle("split-input-file", "treat '// -----' lines as separators between independent graphs")
      .toggle("list-passes", "list the registered passes (with plugins) and exit")
      .value("o", "write the result to this file instead of standard output");
  int rc = 0;
  if (!flags.parse(args, rc)) return rc;

  PassRegistry& registry = PassRegistry::global();
  for (const std::string& plugin : flags.getList("pass-plugin"))
    if (Status s = loadPassPlugin(plugin, registry); !s.ok()) return cli::fail("opt", s.error());

  if (flags.on("list-passes")) {
    for (const PassInfo* p : registry.all()) {
      std::cout << p->name << "  " << p->description << "\n";
      for (const PassOptionSpec& o : p->options) std::cout << "    " << o.name << "=...  " << o.help << "\n";
    }
    return 0;
  }
  if (flags.positional().size() > 1) return cli::fail("opt", "expected one input file, got " + std::to_string(flags.positional().size()));
  if (flags.has("o"))
    if (Status s = cli::checkOutputFile("-o", flags.get("o")); !s.ok()) return cli::fail("opt", s.error());
  std::string input = flags.positional().empty() ? "-" : flags.positional()[0];
  auto text = readTextFile(input);
  if (!text) return cli::fail("opt", text.error());

  PipelineConfig config;
  config.verifyEach = !flags.on("no-verify");
  config.printAfterAll = flags.on("print-after-all");
  for (const std::string& p : flags.getList("print-after")) {
    if (!registry.find(p)) return cli::fail("opt", "--print-after=" + p + ": unknown pass (known: " + registry.knownNames() + ")");
    config.printAfter.insert(p);
  }
  // A pass the pipeline does not run would print nothing: say so, as tpc dump --after does.
  if (!config.printAfter.empty()) {
    std::set<std::string> run;
    auto entries = parsePipeline(flags.has("passes") ? flags.get("passes") : "", "--passes");
    if (entries.ok())
      for (const PipelineEntry& e : *entries) run.insert(e.name);
    for (const std::string& p : config.printAfter)
      if (entries.ok() && !run.count(p))
        return cli::fail("opt", "--print-after=" + p + ": the pipeline does not run " + p + " (--passes=" +
                                    (flags.has("passes") ? flags.get("passes") : std::string()) + "); add it to --passes");
  }
  std::vector<std::string> chunks = flags.on("split-input-file") ? splitInput(*text) : std::vector<std::string>{*text};
  // A chunk of nothing but blank lines and comments holds no graph to run, as in mlir-opt; a file of nothing else is
  // still the parser's error.
  auto blank = [](const std::string& chunk) { return holdsNoGraph(chunk); };
  if (chunks.size() > 1 && !std::all_of(chunks.begin(), chunks.end(), blank))
    chunks.erase(std::remove_if(chunks.begin(), chunks.end(), blank), chunks.end());
  std::string fileName = input == "-" ? "<stdin>" : input;
  std::string out;
  int exitCode = 0;
  for (size_t i = 0; i < chunks.size(); ++i) {
    // A fresh pass manager per graph: passes may keep state between runs.
    PassManager pm(config);
    if (flags.has("passes"))
      if (Status s = pm.addPipeline(flags.get("passes"), "--passes", registry); !s.ok()) return cli::fail("opt", s.error());
    if (i) out += "// -----\n";
    auto g = parseGraph(chunks[i], fileName);
    if (!g) {
      cli::fail("opt", g.error());
      exitCode = 1;
      continue;
    }
    if (Status s = pm.run(**g); !s.ok()) {
      // The file (and, of a split input, which graph) the pass failed on, as a parse error names it.
      cli::fail("opt", cat(fileName, chunks.size() > 1 ? cat(" (graph ", i + 1, " of ", chunks.size(), ")") : "", ": ", s.error()));
      exitCode = 1;
      continue;
    }
    out += printGraph(**g);
  }
  if (exitCode != 0) return exitCode;
  if (!flags.has("o")) {
    std::cout << out;
    return 0;
  }
  if (Status s = writeFileAtomically(flags.get("o"), out); !s.ok()) return cli::fail("opt", s.error());
  return 0;
}

cli::SubcommandRegistration reg("opt", "run a pass pipeline over a .tir graph and print the result", runOpt);

}  // namespace
}  // namespace tpc
