// The parts of the Backend contract that every backend shares: judging a step non-finite, describing the
// first non-finite value, the answers of a backend that cannot look for it or replace its state, and
// copying state between backends through the host.
#include "runtime/backend.h"

#include <cmath>

namespace tpc {

std::string NonFiniteValue::describe() const {
  std::string where = index < 0 ? cat(node, " ", value) : cat(node, " (node ", index + 1, " of ", numNodes, ")");
  std::string sampleStr = std::isnan(sample) ? "nan" : sample > 0 ? "inf" : "-inf";
  return cat(where, rank >= 0 ? cat(" on rank ", rank) : std::string(), ": ", sampleStr, " at element ", element);
}

Result<std::optional<NonFiniteValue>> Backend::findFirstNonFinite(const TensorMap&, int64_t) {
  return makeError("backend ", name(), " cannot re-run a step in checking mode to find its first non-finite value");
}

Status Backend::writeState(const std::string& tensor, const HostTensor&) {
  return makeError("backend ", name(), " cannot replace its state tensor '", tensor, "'");
}

Status Backend::copyStateFrom(const Backend& source, const std::string& name) {
  TPC_ASSIGN(HostTensor t, source.readState(name));
  return writeState(name, t);
}

Status Backend::startStep(const TensorMap& inputs, int64_t stepIndex) {
  if (pending_) return makeError("backend ", name(), ": startStep() twice without finishStep()");
  Result<TensorMap> out = step(inputs, stepIndex);
  if (!out.ok()) return Error{out.error()};
  pending_.emplace(std::move(out));
  return {};
}

Result<TensorMap> Backend::finishStep() {
  if (!pending_) return makeError("backend ", name(), ": finishStep() without startStep()");
  Result<TensorMap> out = std::move(*pending_);
  pending_.reset();
  return out;
}

bool isNonFiniteStep(const TensorMap& outputs) {
  for (const char* name : {kLossOutput, kGradNormOutput}) {
    auto it = outputs.find(name);
    if (it == outputs.end()) continue;
    const HostTensor& t = it->second;
    if (!isFloat(t.dtype())) continue;
    for (int64_t i = 0; i < t.numel(); ++i)
      if (!std::isfinite(t.getAsDouble(i))) return true;
  }
  return false;
}

}  // namespace tpc
