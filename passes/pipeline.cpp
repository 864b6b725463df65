// Pipeline parsing and the pass manager.
#include "passes/pipeline.h"

#include <cctype>
#include <exception>

#include "ir/printer.h"
#include "ir/verifier.h"

namespace tpc {

namespace {

bool isNameChar(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.'; }

// "pass 'mlp-tp' (plugin ./libx.so)": a plugin's pass is named with its library, whose code it is.
std::string passLabel(std::string_view name, const std::string& origin) {
  return cat("pass '", name, "'", origin.empty() ? "" : " (" + origin + ")");
}

// Calls a pass's code (a plugin's too): an exception it throws comes back as "threw: what", for the caller to
// name the pass; tpc's catch-all in main would only print what().
template <typename T, typename F>
Result<T> catchThrown(F&& f, bool& threw) {
  threw = true;
  try {
    Result<T> r = f();
    threw = false;
    return r;
  } catch (const std::exception& e) {
    return makeError("threw: ", e.what());
  } catch (...) {
    return makeError("threw an exception that is not a std::exception");
  }
}

// "--passes:1:COL: error: what" for a user's text; for tpc's own, "what" alone (the caller names the command).
Error placed(const std::string& source, size_t column, const std::string& what) {
  if (source.empty()) return Error{what};
  return makeError(source, ":1:", column, ": error: ", what);
}

}  // namespace

Result<std::vector<PipelineEntry>> parsePipeline(const std::string& text, const std::string& source) {
  std::vector<PipelineEntry> out;
  size_t i = 0;
  // tpc's own pipeline parses unless a pass has a name no pipeline can spell: its text then says where.
  auto fail = [&](size_t at, const std::string& msg) {
    return placed(source, at + 1, source.empty() ? cat(msg, " (column ", at + 1, " of the pipeline '", text, "')") : msg);
  };
  auto skipSpace = [&] {
    while (i < text.size() && std::isspace(static_cast<unsigned char>(text[i]))) ++i;
  };
  skipSpace();
  if (i == text.size()) return fail(0, "the pipeline is empty (example: --passes=cse,dce)");
  while (true) {
    skipSpace();
    size_t start = i;
    while (i < text.size() && isNameChar(text[i])) ++i;
    if (i == start) {
      if (i == text.size()) return fail(i, "expected a pass name at the end of the pipeline");
      return fail(i, std::string("expected a pass name, got '") + text[i] + "'");
    }
    PipelineEntry e;
    e.name = text.substr(start, i - start);
    e.column = static_cast<int>(start) + 1;
    e.source = source;
    e.options = PassOptions(e.name);
    skipSpace();
    if (i < text.size() && text[i] == '(') {
      ++i;
      while (true) {
        skipSpace();
        if (i == text.size()) return fail(i, "unclosed '(' in the options of pass '" + e.name + "'");
        if (text[i] == ')') {
          ++i;
          break;
        }
        size_t ks = i;
        while (i < text.size() && isNameChar(text[i])) ++i;
        if (i == ks) return fail(i, "expected an option name in '" + e.name + "(...)'");
        std::string key = text.substr(ks, i - ks);
        skipSpace();
        if (i >= text.size() || text[i] != '=') return fail(i, "expected '=' after option '" + key + "'");
        ++i;
        skipSpace();
        size_t vs = i;
        while (i < text.size() && text[i] != ',' && text[i] != ')' && !std::isspace(static_cast<unsigned char>(text[i]))) ++i;
        if (i == vs) return fail(i, "option '" + key + "' of pass '" + e.name + "' has no value");
        if (e.options.has(key)) return fail(ks, "option '" + key + "' is given twice");
        e.options.set(key, text.substr(vs, i - vs));
        skipSpace();
        if (i < text.size() && text[i] == ',') {
          ++i;
          continue;
        }
        if (i < text.size() && text[i] == ')') {
          ++i;
          break;
        }
        if (i == text.size()) return fail(i, "unclosed '(' in the options of pass '" + e.name + "'");
        return fail(i, "expected ',' or ')' in the options of pass '" + e.name + "'");
      }
    }
    out.push_back(std::move(e));
    skipSpace();
    if (i == text.size()) break;
    if (text[i] != ',') return fail(i, std::string("expected ',' between passes, got '") + text[i] + "'");
    ++i;
  }
  return out;
}

Status PassManager::addPipeline(const std::string& text, const std::string& source, const PassRegistry& registry) {
  TPC_ASSIGN(auto entries, parsePipeline(text, source));
  return addEntries(entries, registry);
}

Status PassManager::addEntries(const std::vector<PipelineEntry>& entries, const PassRegistry& registry) {
  for (const PipelineEntry& e : entries) {
    const PassInfo* info = registry.find(e.name);
    if (!info)
      return placed(e.source, e.column, cat("unknown pass '", e.name, "' (known: ", registry.knownNames(), ")"));
    for (const auto& [key, value] : e.options.values()) {
      bool known = false;
      std::string keys;
      for (const PassOptionSpec& o : info->options) {
        known = known || o.name == key;
        keys += (keys.empty() ? "" : ", ") + o.name;
      }
      if (!known)
        return placed(e.source, e.column, cat("pass '", e.name, "' has no option '", key, "'",
                                              keys.empty() ? std::string(" (it takes none)") : " (it takes: " + keys + ")"));
    }
    const std::string origin = registry.originOf(e.name) == "built-in" ? "" : registry.originOf(e.name);
    bool threw = false;
    auto pass = catchThrown<std::unique_ptr<Pass>>([&] { return info->factory(e.options); }, threw);
    if (threw) return placed(e.source, e.column, cat(passLabel(e.name, origin), " ", pass.error()));
    // A built-in pass's factory names its pass in its errors; a plugin's that does not is named here, with its library.
    if (!pass)
      return placed(e.source, e.column,
                    origin.empty() || pass.error().find("'" + e.name + "'") != std::string::npos
                        ? pass.error()
                        : cat(passLabel(e.name, origin), ": ", pass.error()));
    if (!pass.value())
      return placed(e.source, e.column, cat(passLabel(e.name, origin), ": its factory returned no pass (a null pointer)"));
    passes_.push_back({std::move(pass).value(), origin});
  }
  return {};
}

Status PassManager::run(Graph& g) {
  llvm::raw_ostream& dump = config_.dumpStream ? *config_.dumpStream : llvm::errs();
  for (auto& [p, origin] : passes_) {
    std::string name(p->name());
    const std::string label = passLabel(name, origin);
    bool threw = false;
    Result<bool> changed = catchThrown<bool>([&, &pass = p] { return pass->run(g); }, threw);
    if (threw) return makeError("error: ", label, " ", changed.error());
    if (!changed) {
      // Passes name themselves in their errors ("megatron-tp: tp=3 ..."): say it once.
      std::string_view why = changed.error();
      if (why.substr(0, name.size() + 2) == name + ": ") why.remove_prefix(name.size() + 2);
      return makeError("error: ", label, ": ", why);
    }
    if (config_.verifyEach) {
      if (Status s = verifyGraph(g); !s.ok())
        return makeError("error: ", label, " produced an invalid graph: ", s.error());
    }
    if (config_.printAfterAll || config_.printAfter.count(name)) {
      dump << "// ----- IR after " << name << (*changed ? "" : " (unchanged)") << " -----\n";
      printGraph(g, dump);
      dump.flush();
    }
  }
  return {};
}

}  // namespace tpc
