// Parses TPC_TEST_FAULT (test_faults.h).
#include "runtime/cpu/test_faults.h"

#include <cstdlib>
#include <sstream>

namespace tpc::cpu {

Result<CpuFaults> parseTestFaults(const std::string& spec) {
  CpuFaults f;
  auto bad = [&](const auto&... why) {
    return makeError("TPC_TEST_FAULT=", spec, ": ", why..., " (expected step=N,nan=%VALUE[,nan-rank=R] or step=N,stall-rank=R)");
  };
  auto integer = [](const std::string& s, int64_t& out) {
    char* end = nullptr;
    long long v = std::strtoll(s.c_str(), &end, 10);
    if (s.empty() || *end != '\0' || v < 0) return false;
    out = v;
    return true;
  };
  std::stringstream in(spec);
  std::string item;
  while (std::getline(in, item, ',')) {
    size_t eq = item.find('=');
    if (eq == std::string::npos) return bad("'", item, "' is not key=value");
    std::string key = item.substr(0, eq), val = item.substr(eq + 1);
    if (key == "step") {
      if (!integer(val, f.step)) return bad("step=", val, " is not a step number");
    } else if (key == "nan") {
      if (val.size() < 2 || val[0] != '%') return bad("nan=", val, " does not name a value (%name)");
      f.nanValue = val;
    } else if (key == "nan-rank") {
      if (!integer(val, f.nanRank)) return bad("nan-rank=", val, " is not a rank");
    } else if (key == "stall-rank") {
      if (!integer(val, f.stallRank)) return bad("stall-rank=", val, " is not a rank");
    } else {
      return bad("unknown key '", key, "'");
    }
  }
  if (f.step < 0) return bad("no step=");
  if (f.nanValue.empty() && f.stallRank < 0) return bad("no fault (nan= or stall-rank=)");
  return f;
}

}  // namespace tpc::cpu
