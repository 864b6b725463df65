// Dataset blends: parsing Megatron-LM's --data-path words and interleaving the datasets' windows.
#include "frontend/data_blend.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>

namespace tpc {

namespace {

std::vector<std::string> words(std::string_view s) {
  std::vector<std::string> out;
  size_t i = 0;
  while (i < s.size()) {
    while (i < s.size() && std::isspace(static_cast<unsigned char>(s[i]))) ++i;
    size_t start = i;
    while (i < s.size() && !std::isspace(static_cast<unsigned char>(s[i]))) ++i;
    if (i > start) out.emplace_back(s.substr(start, i - start));
  }
  return out;
}

// The word as a number, when all of it is one.
bool isNumber(const std::string& w, double& value) {
  char* end = nullptr;
  value = std::strtod(w.c_str(), &end);
  return !w.empty() && *end == '\0';
}

}  // namespace

Result<std::vector<DataBlendEntry>> parseDataBlend(std::string_view spec,
                                                   const std::function<bool(const std::string&)>& isDataset,
                                                   const std::string& name) {
  std::vector<std::string> ws;
  if (spec.find('\n') != std::string_view::npos) {
    for (size_t start = 0; start <= spec.size();) {
      size_t end = std::min(spec.find('\n', start), spec.size());
      if (end > start) ws.emplace_back(spec.substr(start, end - start));
      start = end + 1;
    }
  } else if (isDataset && !spec.empty() && isDataset(std::string(spec))) {
    return std::vector<DataBlendEntry>{{std::string(spec), 0}};
  } else {
    ws = words(spec);
  }
  if (ws.size() == 1) return std::vector<DataBlendEntry>{{ws[0], 0}};  // Megatron-LM: one word is a prefix
  if (ws.empty()) return makeError(name, ": no dataset prefix given (expected PREFIX, or weight-prefix pairs such as "
                                   "'0.3 web 0.7 books')");
  double first = 0;
  std::vector<DataBlendEntry> entries;
  if (!isNumber(ws[0], first)) {  // prefixes alone
    for (const std::string& w : ws) {
      double ignored = 0;
      if (isNumber(w, ignored))
        return makeError(name, " '", spec, "': '", w, "' is a number among prefixes; give a weight before every "
                         "prefix (e.g. '0.3 web 0.7 books') or none");
      entries.push_back({w, 0});
    }
    return entries;
  }
  if (ws.size() % 2 != 0)
    return makeError(name, " '", spec, "': weights and prefixes do not pair up (", ws.size(), " words); give "
                     "'WEIGHT PREFIX' for every dataset, e.g. '0.3 web 0.7 books'");
  for (size_t i = 0; i < ws.size(); i += 2) {
    double w = 0, ignored = 0;
    if (!isNumber(ws[i], w))
      return makeError(name, " '", spec, "': '", ws[i], "' should be the weight of '", ws[i + 1], "' (a positive "
                       "number); give 'WEIGHT PREFIX' for every dataset");
    if (!std::isfinite(w) || w <= 0)
      return makeError(name, " '", spec, "': the weight ", ws[i], " of '", ws[i + 1], "' is not a positive number "
                       "(leave a dataset out rather than weigh it 0)");
    if (isNumber(ws[i + 1], ignored))
      return makeError(name, " '", spec, "': '", ws[i + 1], "' stands where a prefix should; give 'WEIGHT PREFIX' "
                       "for every dataset");
    entries.push_back({ws[i + 1], w});
  }
  return entries;
}

bool looksLikeModelFile(const std::string& word) {
  for (std::string_view ext : {".fb", ".json"})
    if (word.size() > ext.size() && word.compare(word.size() - ext.size(), ext.size(), ext) == 0) return true;
  return false;
}

BlendOrder::BlendOrder(std::vector<double> weights) : weights_(std::move(weights)), taken_(weights_.size(), 0) {
  double sum = 0;
  for (double w : weights_) sum += w;
  // Weights near the double's maximum (1e308 1e308) sum to infinity, which made every share 0 and the order pick the
  // first dataset whatever the weights: scaled by the largest first. (Only then: Megatron divides by the sum, and
  // the order's ties depend on those bits.)
  if (!std::isfinite(sum)) {
    const double largest = *std::max_element(weights_.begin(), weights_.end());
    sum = 0;
    for (double& w : weights_) sum += (w /= largest);
  }
  for (double& w : weights_) w /= sum;
}

size_t BlendOrder::next() {
  const double s = std::max(static_cast<double>(position_), 1.0);
  size_t best = 0;
  double bestError = weights_[0] * s - static_cast<double>(taken_[0]);
  for (size_t i = 1; i < weights_.size(); ++i) {
    double error = weights_[i] * s - static_cast<double>(taken_[i]);
    if (error > bestError) {
      bestError = error;
      best = i;
    }
  }
  if (!recent_.empty()) {
    recent_[position_ % recent_.size()] = static_cast<uint32_t>(best);
    if (position_ - recentFrom_ >= recent_.size()) ++recentFrom_;
  }
  ++taken_[best];
  ++position_;
  return best;
}

void BlendOrder::keepRecent(size_t samples) {
  recent_.assign(samples, 0);
  recentFrom_ = position_;
}

std::vector<uint64_t> BlendOrder::takenAt(uint64_t position) const {
  if (position > position_) return {};
  if (position == position_) return taken_;
  if (recent_.empty() || position < recentFrom_) return {};
  std::vector<uint64_t> taken = taken_;
  for (uint64_t p = position; p < position_; ++p) --taken[recent_[p % recent_.size()]];
  return taken;
}

bool BlendOrder::fits(uint64_t position, const std::vector<uint64_t>& taken) const {
  // The greedy order keeps each count within the number of datasets of its share (weight x position).
  if (taken.size() != taken_.size()) return false;
  uint64_t sum = 0;
  for (size_t i = 0; i < taken.size(); ++i) {
    sum += taken[i];
    if (std::abs(weights_[i] * static_cast<double>(position) - static_cast<double>(taken[i])) >
        static_cast<double>(taken_.size()))
      return false;
  }
  return sum == position;
}

Status BlendOrder::seek(uint64_t position, const std::vector<uint64_t>& taken) {
  if (weights_.size() == 1) {  // the common case, without the replay
    taken_[0] = position_ = recentFrom_ = position;
    return {};
  }
  if (!taken.empty() && fits(position, taken)) {
    taken_ = taken;
    position_ = recentFrom_ = position;
    return {};
  }
  if (position > kMaxReplay)
    return makeError("position ", position, " is past any run's end (", kMaxReplay, " samples)");
  std::fill(taken_.begin(), taken_.end(), 0);
  position_ = 0;
  const size_t kept = recent_.size();
  recent_.clear();  // not recorded during the replay
  while (position_ < position) next();
  recent_.assign(kept, 0);
  recentFrom_ = position_;
  return {};
}

BlendedWindows::BlendedWindows(std::vector<Part> parts, uint32_t seqLen, uint64_t seed) {
  if (parts.empty()) {
    status_ = makeError("no dataset to read windows from");
    return;
  }
  std::vector<double> weights;
  for (Part& p : parts) {
    weights.push_back(p.weight);
    parts_.push_back(std::make_unique<Held>(std::move(p.data), p.docs, seqLen, seed));
    if (Status s = parts_.back()->windows.status(); !s.ok() && status_.ok()) status_ = s;
  }
  if (!status_.ok()) return;
  if (std::all_of(weights.begin(), weights.end(), [](double w) { return w <= 0; }))
    for (size_t i = 0; i < parts_.size(); ++i) weights[i] = static_cast<double>(parts_[i]->windows.windowsPerEpoch());
  order_ = std::make_unique<BlendOrder>(std::move(weights));
}

Status BlendedWindows::next(int32_t* out) {
  if (!status_.ok()) return status_;
  return parts_[order_->next()]->windows.next(out);
}

Status BlendedWindows::seek(uint64_t position, const std::vector<uint64_t>& taken) {
  if (!order_) return status_;
  TPC_TRY(order_->seek(position, taken));
  for (size_t i = 0; i < parts_.size(); ++i) parts_[i]->windows.seek(order_->taken()[i]);
  return {};
}

std::vector<uint64_t> BlendedWindows::takenAt(uint64_t position) const {
  return order_ && parts_.size() > 1 ? order_->takenAt(position) : std::vector<uint64_t>{};
}

uint64_t BlendedWindows::windowsPerEpoch() const {
  uint64_t n = 0;
  for (const auto& p : parts_) n += p->windows.windowsPerEpoch();
  return n;
}

}  // namespace tpc
