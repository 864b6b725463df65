#include "runtime/checkpoint.h"

#include <stdexcept>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <tuple>

#include "ir/assert.h"
#include "ir/file_io.h"
#include "ir/json_text.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/JSON.h"

namespace tpc {
namespace fs = std::filesystem;
namespace {

const char* kLatest = "latest_checkpointed_iteration.txt";

std::string iterName(int64_t it) {
  char b[32];
  std::snprintf(b, sizeof b, "iter_%07lld", static_cast<long long>(it));
  return b;
}

std::string stateJson(const CheckpointState& s) {
  llvm::json::Object o{{"format", "tpc-checkpoint-1"},
                       {"iteration", s.iteration},
                       {"data_position", int64_t(s.dataPosition)},
                       {"seed", std::to_string(s.seed)},  // a string: JSON numbers lose 64-bit seeds
                       {"skipped_steps", s.skippedSteps},
                       {"model", s.model},
                       {"config", s.config}};
  if (!s.dataTaken.empty()) {
    llvm::json::Array taken;
    for (uint64_t t : s.dataTaken) taken.push_back(int64_t(t));
    o["data_taken"] = std::move(taken);
  }
  if (!s.settings.empty()) {
    llvm::json::Object settings;
    for (const auto& [k, v] : s.settings) settings[k] = v;
    o["settings"] = std::move(settings);
  }
  if (s.lossScale > 0) {
    o["loss_scale"] = s.lossScale;
    o["loss_scale_good_steps"] = s.lossScaleGoodSteps;
    if (s.lossScaleHysteresisLeft >= 0) o["loss_scale_hysteresis_left"] = s.lossScaleHysteresisLeft;
  }
  std::string out;
  llvm::raw_string_ostream os(out);
  os << llvm::formatv("{0:2}", llvm::json::Value(std::move(o))) << "\n";
  return os.str();
}

}  // namespace

Result<CheckpointState> parseCheckpointState(const std::string& text, const std::string& path) {
  auto v = parseJsonText(text);
  if (!v.ok()) return makeError(path, ": error: ", v.error());
  const llvm::json::Object* o = v->getAsObject();
  if (!o || o->getString("format") != llvm::StringRef("tpc-checkpoint-1"))
    return makeError(path, ": error: not a tpc checkpoint state (format tpc-checkpoint-1)");
  CheckpointState s;
  auto it = o->getInteger("iteration");
  auto pos = o->getInteger("data_position");
  auto seed = o->getString("seed");
  // Each field named on its own: present but of the wrong kind ("4", 1e30) is not the same fix as missing.
  for (auto [key, ok, kind] : {std::tuple{"iteration", it.hasValue(), "an integer"},
                               std::tuple{"data_position", pos.hasValue(), "an integer"},
                               std::tuple{"seed", seed.hasValue(), "a string of decimal digits"}})
    if (!ok)
      return makeError(path, ": error: ", key, o->get(key) ? " is not " : " is missing; it must be ", kind,
                       " (state.json is written by tpc run --save; a hand-edited one needs every field)");
  for (auto [key, v] : {std::pair{"iteration", *it}, std::pair{"data_position", *pos}})
    if (v < 0) return makeError(path, ": error: ", key, " must be >= 0, got ", v);
  s.iteration = *it;
  s.dataPosition = static_cast<uint64_t>(*pos);
  // Digits only: stoull alone would take "-1" (wrapping to 2^64 - 1) or "12abc".
  const std::string seedText = seed->str();
  bool digits = !seedText.empty() && seedText.find_first_not_of("0123456789") == std::string::npos;
  try {
    if (!digits) throw std::invalid_argument(seedText);
    s.seed = std::stoull(seedText);
  } catch (...) {
    return makeError(path, ": error: seed '", seedText, "' is not a number (a decimal unsigned 64-bit integer)");
  }
  // Older checkpoints have no skipped_steps (0) and wrote loss_scale 1 for runs without loss scaling.
  auto skipped = o->getInteger("skipped_steps");
  if (skipped && (*skipped < 0 || *skipped > s.iteration))
    return makeError(path, ": error: skipped_steps ", *skipped, " must be in [0, iteration ", s.iteration, "]");
  s.skippedSteps = skipped.getValueOr(0);
  if (auto good = o->getInteger("loss_scale_good_steps")) {
    auto scale = o->getNumber("loss_scale");
    if (!scale || !(*scale > 0) || !std::isfinite(*scale) || *good < 0)
      return makeError(path, ": error: loss_scale must be a positive number and loss_scale_good_steps >= 0");
    s.lossScale = *scale;
    s.lossScaleGoodSteps = *good;
    if (o->get("loss_scale_hysteresis_left")) {
      auto left = o->getInteger("loss_scale_hysteresis_left");
      if (!left || *left < 0) return makeError(path, ": error: loss_scale_hysteresis_left must be an integer >= 0");
      s.lossScaleHysteresisLeft = *left;
    }
  }
  if (const llvm::json::Value* taken = o->get("data_taken")) {
    const llvm::json::Array* a = taken->getAsArray();
    for (size_t i = 0; a && i < a->size(); ++i) {
      auto t = (*a)[i].getAsInteger();
      if (!t || *t < 0) {
        a = nullptr;
        break;
      }
      s.dataTaken.push_back(static_cast<uint64_t>(*t));
    }
    if (!a || s.dataTaken.empty())
      return makeError(path, ": error: data_taken must be a list of integers >= 0, one a dataset of the blend");
  }
  if (auto m = o->getString("model")) s.model = m->str();
  if (auto c = o->getString("config")) s.config = c->str();
  if (const llvm::json::Object* settings = o->getObject("settings"))
    for (const auto& [k, v] : *settings) {
      auto text = v.getAsString();
      if (!text) return makeError(path, ": error: settings.", k.str(), " is not a string");
      s.settings[k.str()] = text->str();
    }
  return s;
}

namespace {

Result<CheckpointState> parseState(const std::string& path) {
  std::ifstream f(path);
  if (!f) return makeError(path, ": error: cannot open the checkpoint state (a half-written checkpoint?)");
  std::stringstream ss;
  ss << f.rdbuf();
  return parseCheckpointState(ss.str(), path);
}

// Whether `part` is the leading rows of `whole` (same rank and dims after the first, fewer rows).
bool leadingRowsOf(const Shape& part, const Shape& whole) {
  return !part.empty() && part.size() == whole.size() && part[0] <= whole[0] &&
         std::equal(part.begin() + 1, part.end(), whole.begin() + 1);
}

std::vector<std::pair<int64_t, fs::path>> checkpointsIn(const fs::path& dir) {
  std::vector<std::pair<int64_t, fs::path>> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    std::string n = e.path().filename().string();
    if (e.is_directory() && n.rfind("iter_", 0) == 0 && n.size() > 5 &&
        n.find_first_not_of("0123456789", 5) == std::string::npos)
      out.push_back({std::stoll(n.substr(5)), e.path()});
  }
  std::sort(out.begin(), out.end());
  return out;
}

// The files of a checkpoint (tensors, extra files, state.json last: it marks the folder complete) into `folder`.
Status writeCheckpointFolder(const std::string& folder, const CheckpointState& state,
                             const std::vector<CheckpointTensor>& tensors,
                             const std::function<Result<HostTensor>(const std::string&)>& read,
                             const std::map<std::string, std::string>& extraFiles) {
  SafetensorsFile file;
  for (const CheckpointTensor& t : tensors) {
    TPC_ASSIGN(HostTensor v, read(t.name));
    // The layout holds all of v or its leading rows (a vocabulary without the padding rows).
    HostTensor laid(TensorType(v.dtype(), t.shape));
    if (laid.bytes() > v.bytes() || (laid.bytes() < v.bytes() && !leadingRowsOf(t.shape, v.shape())))
      return makeError("checkpoint: tensor ", t.name, " is ", v.type().str(), ", which the layout ",
                       laid.type().str(), " does not hold");
    std::copy(v.raw(), v.raw() + laid.bytes(), laid.raw());
    file.tensors.push_back({t.name, std::move(laid)});
  }
  file.metadata["format"] = "tpc-checkpoint-1";
  file.metadata["iteration"] = std::to_string(state.iteration);
  TPC_TRY(writeSafetensors((fs::path(folder) / "model.safetensors").string(), file));
  for (const auto& [name, bytes] : extraFiles) TPC_TRY(writeFileAtomically((fs::path(folder) / name).string(), bytes));
  // A test hook: die like a SIGKILL between the tensors and the state (the state marks completeness).
  if (const char* crash = std::getenv("TPC_TEST_KILL_DURING_SAVE"); crash && std::stoll(crash) == state.iteration)
    std::_Exit(137);
  TPC_TRY(writeFileAtomically((fs::path(folder) / "state.json").string(), stateJson(state)));
  return {};
}

}  // namespace

Status saveCheckpoint(const std::string& dir, const CheckpointState& state, const std::vector<CheckpointTensor>& tensors,
                      const std::function<Result<HostTensor>(const std::string&)>& read, int64_t keep,
                      const std::map<std::string, std::string>& extraFiles) {
  std::error_code ec;
  // The folders this save makes: removed again if it fails before a checkpoint is complete, so a failed first save
  // (a full disk) leaves no empty --save folder behind.
  RemoveOnError madeFolders(firstMissingFolder(dir));
  fs::create_directories(dir, ec);
  if (ec) return makeError(dir, ": error: cannot create the checkpoint directory: ", ec.message());
  // Debris of saves that were killed.
  for (const auto& e : fs::directory_iterator(dir, ec))
    if (e.path().filename().string().rfind(".tmp.", 0) == 0) fs::remove_all(e.path(), ec);
  const fs::path final = fs::path(dir) / iterName(state.iteration);
  const fs::path tmp = fs::path(dir) / (".tmp." + iterName(state.iteration));
  fs::create_directories(tmp, ec);
  if (ec) return makeError(tmp.string(), ": error: cannot create: ", ec.message());
  // A save that fails (a full disk, a tensor that does not fit its layout) leaves nothing behind.
  RemoveOnError cleanup(tmp);
  TPC_TRY(writeCheckpointFolder(tmp.string(), state, tensors, read, extraFiles));
  fs::remove_all(final, ec);
  fs::rename(tmp, final, ec);
  cleanup.keep();  // from here on tmp may be the only complete copy
  madeFolders.keep();
  if (ec)
    return makeError(final.string(), ": error: cannot move the checkpoint into place (it is complete in ", tmp.string(),
                     "): ", ec.message());
  TPC_TRY(writeFileAtomically((fs::path(dir) / kLatest).string(), std::to_string(state.iteration) + "\n"));
  if (keep > 0) {
    // The one just written (the latest file's) stays, with keep - 1 others: the newest before it, then (too few)
    // the lowest after it. A folder that holds a longer earlier run's iterations never loses the checkpoint
    // its latest file names, nor this run's previous ones to that run's.
    std::vector<std::pair<int64_t, fs::path>> others;
    for (auto& c : checkpointsIn(dir))
      if (c.first != state.iteration) others.push_back(std::move(c));
    auto rank = [&](int64_t it) { return it < state.iteration ? state.iteration - it : it; };  // smaller: kept first
    std::sort(others.begin(), others.end(), [&](const auto& a, const auto& b) { return rank(a.first) < rank(b.first); });
    for (size_t i = static_cast<size_t>(keep - 1); i < others.size(); ++i) fs::remove_all(others[i].second, ec);
  }
  return {};
}

Status stageCheckpoint(FileCommit& commit, const std::string& dir, const CheckpointState& state,
                       const std::vector<CheckpointTensor>& tensors,
                       const std::function<Result<HostTensor>(const std::string&)>& read,
                       const std::map<std::string, std::string>& extraFiles) {
  // DIR/iter_N.tmp.PID.K: not an iter_N name, so no reader takes it for a checkpoint while it is written.
  const std::string folder = commit.stage((fs::path(dir) / iterName(state.iteration)).string());
  std::error_code ec;
  fs::create_directory(folder, ec);
  if (ec) return makeError(folder, ": error: cannot create: ", ec.message());
  TPC_TRY(writeCheckpointFolder(folder, state, tensors, read, extraFiles));
  return commit.write((fs::path(dir) / kLatest).string(), std::to_string(state.iteration) + "\n");
}

bool ownedBySave(const std::string& name) {
  return name == kLatest || name.rfind("iter_", 0) == 0 || name.rfind(".tmp.", 0) == 0;
}

std::string checkpointHeldIn(const std::string& dir) {
  std::error_code ec;
  if (fs::exists(fs::path(dir) / kLatest, ec)) return kLatest;
  auto all = checkpointsIn(dir);
  return all.empty() ? std::string() : all.back().second.filename().string();
}

Result<LoadedCheckpoint> loadCheckpoint(const std::string& dir) {
  fs::path p(dir);
  std::error_code ec;
  if (!fs::is_directory(p, ec))
    return makeError(dir, fs::exists(p, ec) ? ": error: is a file, not a checkpoint directory (a --save directory or "
                                              "one of its iter_N directories)"
                                            : ": error: no such checkpoint directory");
  if (!fs::exists(p / "state.json", ec)) {
    fs::path latest = p / kLatest;
    std::ifstream f(latest);
    if (!f) {
      auto all = checkpointsIn(p);
      return makeError(latest.string(), ": error: missing, so ", dir, " holds no complete checkpoint",
                       all.empty() ? std::string() : " (found " + all.back().second.filename().string() +
                                                         "; pass that directory to use it)");
    }
    // The whole file is one decimal number (Megatron's tracker file): "4x" or "4.0" is a damaged file, not 4.
    std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    while (!text.empty() && std::isspace(static_cast<unsigned char>(text.back()))) text.pop_back();
    long long it = -1;
    if (!text.empty() && text.size() <= 18 && text.find_first_not_of("0123456789") == std::string::npos) it = std::stoll(text);
    if (it < 0)
      return makeError(latest.string(), ": error: holds '", text.substr(0, 40), "', not an iteration number (the N of ",
                       dir, "/iter_N; write it, or pass that iter_N directory)");
    p /= iterName(it);
    if (!fs::is_directory(p, ec)) {
      auto all = checkpointsIn(fs::path(dir));
      return makeError(latest.string(), ": error: names iteration ", it, ", but ", p.string(), " does not exist",
                       all.empty() ? std::string(" (nor does any other iter_N)")
                                   : " (found " + all.back().second.filename().string() + "; pass that directory to use it)");
    }
  }
  LoadedCheckpoint ck;
  ck.path = p.string();
  TPC_ASSIGN(ck.state, parseState((p / "state.json").string()));
  TPC_ASSIGN(ck.tensors, readSafetensors((p / "model.safetensors").string()));
  return ck;
}

Result<HostTensor> checkpointTensor(const LoadedCheckpoint& ckpt, const std::string& name, const Shape& layout,
                                    const TensorType& want) {
  const HostTensor* t = ckpt.tensors.find(name);
  if (!t)
    return makeError(ckpt.path, "/model.safetensors: error: tensor ", name,
                     " is missing (a checkpoint of another model?)");
  TensorType layoutType(want.dtype, layout);
  if (t->type() != layoutType)
    return makeError(ckpt.path, "/model.safetensors: error: tensor ", name, " is ", t->type().str(), ", this model needs ",
                     layoutType.str(), " (a checkpoint of another model shape?)");
  // `want` may hold more rows than the layout (vocabulary padding for this tp): those start at zero.
  HostTensor out(want);
  if (t->bytes() > out.bytes() || (t->bytes() < out.bytes() && !leadingRowsOf(layout, want.shape)))
    return makeError(ckpt.path, "/model.safetensors: error: tensor ", name, " ", t->type().str(),
                     " does not fit this model's ", want.str());
  std::copy(t->raw(), t->raw() + t->bytes(), out.raw());
  return out;
}

Status requireFiniteWeights(const HostTensor& t, const std::string& file, const std::string& name,
                            std::string_view consequence) {
  TPC_ASSERT(t.dtype() == DType::f32, "requireFiniteWeights takes f32 tensors, got " + t.type().str());
  const float* v = t.data<float>();
  for (int64_t i = 0; i < t.numel(); ++i)
    if (!std::isfinite(v[i])) return makeError(file, ": error: tensor ", name, " holds ", v[i], " at element ", i, "; ", consequence);
  return {};
}

}  // namespace tpc
