// The `tpc` command line: sub-command registration and a small flag parser shared by all sub-commands.
// Each sub-command lives in its own file and registers itself with a static SubcommandRegistration.
#pragma once

#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "ir/status.h"

namespace tpc::cli {

struct Subcommand {
  std::string name;
  std::string summary;                                  // one line for `tpc --help`
  std::function<int(std::vector<std::string> args)> run;  // args exclude the sub-command name
};

void registerSubcommand(Subcommand s);
const std::map<std::string, Subcommand>& subcommands();

struct SubcommandRegistration {
  SubcommandRegistration(std::string name, std::string summary, std::function<int(std::vector<std::string>)> run) {
    registerSubcommand({std::move(name), std::move(summary), std::move(run)});
  }
};

// Flags: --name=value, --name value, or boolean --name. Declared up front so that unknown flags and
// missing values are one clear error. Positional arguments are collected in order.
class Flags {
 public:
  Flags(std::string command, std::string usage) : command_(std::move(command)), usage_(std::move(usage)) {}
  // A flag taking a value; `help` is shown by --help.
  Flags& value(const std::string& name, const std::string& help, std::optional<std::string> def = std::nullopt);
  // A boolean flag.
  Flags& toggle(const std::string& name, const std::string& help);
  // A value flag that may be given several times.
  Flags& list(const std::string& name, const std::string& help);
  // A value of several words, as Megatron-LM's `--data-path 0.3 web 0.7 books`: the words up to the next one that
  // starts with '-' are the value, joined by spaces, or by newlines when a word holds a space or a tab
  // (--name=VALUE takes one word).
  Flags& words(const std::string& name, const std::string& help);

  // Parses; on --help prints the help and returns false with exitCode 0; on bad flags prints one error (a line,
  // or with several bad flags a line for each, all unknown options of the command line among them, each with its
  // hint) and returns false with exitCode 1. An unknown option's next word is taken for its value.
  bool parse(const std::vector<std::string>& args, int& exitCode);

  bool has(const std::string& name) const;
  std::string get(const std::string& name) const;  // value or default ("" if none)
  std::vector<std::string> getList(const std::string& name) const;
  bool on(const std::string& name) const { return has(name); }
  // Integer value with an error naming the flag when it is not a number or out of [lo, hi].
  Result<long long> getInt(const std::string& name, long long lo, long long hi) const;
  Result<double> getDouble(const std::string& name) const;
  const std::vector<std::string>& positional() const { return positional_; }
  const std::string& command() const { return command_; }  // "run", for messages: "tpc run: warning: ..."
  std::string help() const;

 private:
  struct Spec {
    std::string help;
    bool takesValue = true, repeated = false;
    std::optional<std::string> def;
    bool severalWords = false;
  };
  std::string command_, usage_;
  std::vector<std::pair<std::string, Spec>> specs_;
  std::map<std::string, std::vector<std::string>> values_;
  std::vector<std::string> positional_;
  const Spec* find(const std::string& name) const;
};

// Prints "tpc <cmd>: error: <msg>" to stderr and returns 1: the one way sub-commands report user errors.
int fail(const std::string& command, const std::string& message);

}  // namespace tpc::cli
