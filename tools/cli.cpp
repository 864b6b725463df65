// Sub-command registry and flag parsing for the `tpc` command line.
#include "tools/cli.h"

#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <iostream>

#include "tools/megatron_flag_hints.h"

namespace tpc::cli {

namespace {
std::map<std::string, Subcommand>& registry() {
  static std::map<std::string, Subcommand> r;
  return r;
}
// "-o" for one-letter flags, "--name" otherwise: the flag as the user types it.
std::string dashed(const std::string& name) { return (name.size() == 1 ? "-" : "--") + name; }

// The word after an unknown option, taken for its value: not an option, but a negative number is one ("-0.5").
bool looksLikeValue(const std::string& word) {
  if (word.empty()) return false;
  if (word[0] != '-') return true;
  return word.size() > 1 && (std::isdigit(static_cast<unsigned char>(word[1])) || word[1] == '.');
}
}  // namespace

void registerSubcommand(Subcommand s) { registry()[s.name] = std::move(s); }
const std::map<std::string, Subcommand>& subcommands() { return registry(); }

int fail(const std::string& command, const std::string& message) {
  std::cout.flush();
  // Messages that already carry a location ("file:1:2: error: ...") are printed as they are.
  if (message.find("error: ") != std::string::npos)
    std::cerr << message << "\n";
  else
    std::cerr << "tpc " << command << ": error: " << message << "\n";
  return 1;
}

Flags& Flags::value(const std::string& name, const std::string& help, std::optional<std::string> def) {
  specs_.push_back({name, Spec{help, true, false, std::move(def)}});
  return *this;
}

Flags& Flags::toggle(const std::string& name, const std::string& help) {
  specs_.push_back({name, Spec{help, false, false, std::nullopt}});
  return *this;
}

Flags& Flags::list(const std::string& name, const std::string& help) {
  specs_.push_back({name, Spec{help, true, true, std::nullopt}});
  return *this;
}

Flags& Flags::words(const std::string& name, const std::string& help) {
  specs_.push_back({name, Spec{help, true, false, std::nullopt}});
  specs_.back().second.severalWords = true;
  return *this;
}

const Flags::Spec* Flags::find(const std::string& name) const {
  for (const auto& [n, s] : specs_)
    if (n == name) return &s;
  return nullptr;
}

std::string Flags::help() const {
  std::string s = "usage: " + usage_ + "\n\noptions:\n";
  for (const auto& [name, spec] : specs_) {
    std::string left = "  " + dashed(name) + (spec.severalWords ? " VALUE..." : spec.takesValue ? " VALUE" : "");
    if (left.size() < 30) left += std::string(30 - left.size(), ' ');
    else left += "\n" + std::string(30, ' ');
    s += left + spec.help;
    if (spec.def) s += " (default: " + *spec.def + ")";
    s += "\n";
  }
  s += "  --help                      show this help\n";
  return s;
}

bool Flags::parse(const std::vector<std::string>& args, int& exitCode) {
  // Every bad option of the command line, so that a pasted Megatron-LM command is fixed in one round.
  std::vector<std::string> errors;
  size_t unknown = 0;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--help" || a == "-h") {
      std::cout << help();
      exitCode = 0;
      return false;
    }
    if (a == "--") {
      for (size_t j = i + 1; j < args.size(); ++j) positional_.push_back(args[j]);
      break;
    }
    if (a.size() < 2 || a[0] != '-') {
      positional_.push_back(a);
      continue;
    }
    std::string body = a.substr(a[1] == '-' ? 2 : 1), name = body, val;
    bool hasEq = false;
    if (size_t eq = body.find('='); eq != std::string::npos) {
      name = body.substr(0, eq);
      val = body.substr(eq + 1);
      hasEq = true;
    }
    const Spec* spec = find(name);
    if (!spec) {
      // The next word is taken for the option's value ("--num-workers 2"): not a positional, and shown in the hint.
      std::optional<std::string> given;
      if (hasEq) given = val;
      else if (i + 1 < args.size() && looksLikeValue(args[i + 1])) given = args[++i];
      std::vector<std::string> known;
      for (const auto& [n, s] : specs_) known.push_back(n);
      std::string hint = unknownOptionHint(command_, name, given, known);
      errors.push_back("unknown option '" + a + "'" + (hint.empty() ? " (see 'tpc " + command_ + " --help')" : hint));
      ++unknown;
      continue;
    }
    if (!spec->takesValue) {
      if (hasEq) errors.push_back("option " + dashed(name) + " takes no value");
      else values_[name].push_back("true");
      continue;
    }
    if (!hasEq) {
      if (i + 1 >= args.size()) {
        errors.push_back("option " + dashed(name) + " needs a value");
        continue;
      }
      // "--save --quiet": the next word is a flag, not the value; "--x=--y" passes a value that starts with "--".
      // So is one of this command's one-letter flags ("--preset -o m.fb" took -o as the preset, then blamed m.fb);
      // other words that start with '-' are values ("--lr -1").
      const std::string& next = args[i + 1];
      const bool longFlag = next.size() > 2 && next.compare(0, 2, "--") == 0;
      const std::string shortName = next.size() >= 2 && next[0] == '-' && next[1] != '-' ? next.substr(1, next.find('=') - 1) : "";
      if (longFlag || (shortName.size() == 1 && (shortName == "h" || find(shortName)))) {
        errors.push_back("option " + dashed(name) + " needs a value, but the next argument is the option '" + next +
                         "' (write " + dashed(name) + "=VALUE for a value that starts with " + (longFlag ? "--" : "-") + ")");
        continue;
      }
      val = args[++i];
      if (spec->severalWords) {
        // Joined by spaces, or by newlines where a word holds a space itself ("my data/web"), so that the words
        // can be told apart again (parseDataBlend).
        std::vector<std::string> words{val};
        // A negative number is a word too ("0.5 web -0.5 books"), for parseDataBlend to refuse as a weight.
        while (i + 1 < args.size() && looksLikeValue(args[i + 1])) words.push_back(args[++i]);
        bool spaced = false;
        for (const std::string& w : words) spaced |= w.find_first_of(" \t") != std::string::npos;
        for (size_t w = 1; w < words.size(); ++w) val += (spaced ? "\n" : " ") + words[w];
      }
    }
    if (!spec->repeated && values_.count(name)) {
      errors.push_back("option " + dashed(name) + " is given twice");
      continue;
    }
    values_[name].push_back(val);
  }
  if (errors.size() == 1) {
    exitCode = fail(command_, errors[0]);
    return false;
  }
  if (!errors.empty()) {
    std::string message = unknown == errors.size() ? cat(unknown, " unknown options:") : cat(errors.size(), " bad options:");
    for (const std::string& e : errors) message += "\n  " + e;
    exitCode = fail(command_, message);
    return false;
  }
  exitCode = 0;
  return true;
}

bool Flags::has(const std::string& name) const { return values_.count(name) != 0; }

std::string Flags::get(const std::string& name) const {
  auto it = values_.find(name);
  if (it != values_.end()) return it->second.back();
  const Spec* s = find(name);
  return s && s->def ? *s->def : "";
}

std::vector<std::string> Flags::getList(const std::string& name) const {
  auto it = values_.find(name);
  return it == values_.end() ? std::vector<std::string>{} : it->second;
}

Result<long long> Flags::getInt(const std::string& name, long long lo, long long hi) const {
  std::string v = get(name);
  char* end = nullptr;
  errno = 0;
  long long x = std::strtoll(v.c_str(), &end, 10);
  if (v.empty() || *end != '\0') return makeError(dashed(name), "=", v, " is not an integer");
  // Below the least value of a flag whose upper bound is only a guard against overflow (2^40 and up; a tighter
  // limit may hold elsewhere), the lower bound alone.
  if (errno != ERANGE && x < lo && hi >= (1LL << 40)) return makeError(dashed(name), "=", v, " must be >= ", lo);
  if (errno == ERANGE || x < lo || x > hi) return makeError(dashed(name), "=", v, " is out of range [", lo, ", ", hi, "]");
  return x;
}

Result<double> Flags::getDouble(const std::string& name) const {
  std::string v = get(name);
  char* end = nullptr;
  double x = std::strtod(v.c_str(), &end);
  if (v.empty() || *end != '\0') return makeError(dashed(name), "=", v, " is not a number");
  return x;
}

}  // namespace tpc::cli
