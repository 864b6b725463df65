// The per-op table of a profiled step (step_profile.h).
#include "runtime/cuda/step_profile.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <numeric>

#include "ir/status.h"  // cat

namespace tpc::cuda {

std::string formatStepProfile(const std::vector<TimedLaunch>& launches, int64_t step, double replayMs, int top) {
  struct Row {
    int64_t count = 0;
    double ms = 0;
  };
  std::map<std::string, Row> rows;
  double total = 0;
  for (const TimedLaunch& l : launches) {
    Row& r = rows[l.op];
    ++r.count;
    r.ms += l.ms;
    total += l.ms;
  }
  std::vector<std::pair<std::string, Row>> sorted(rows.begin(), rows.end());
  std::stable_sort(sorted.begin(), sorted.end(), [](const auto& a, const auto& b) { return a.second.ms > b.second.ms; });
  std::string out;
  char buf[512];
  char replay[96] = "";
  if (replayMs > 0) std::snprintf(replay, sizeof replay, "; %.2f ms as one CUDA graph replay", replayMs);
  std::snprintf(buf, sizeof buf, "profile of step %lld: %zu launches, %.2f ms of GPU time summed launch by launch (CUDA events, no graph)%s\n",
                static_cast<long long>(step), launches.size(), total, replay);
  out += buf;
  std::snprintf(buf, sizeof buf, "  %-24s %9s %10s %7s\n", "op", "launches", "ms", "share");
  out += buf;
  for (const auto& [op, r] : sorted) {
    std::snprintf(buf, sizeof buf, "  %-24s %9lld %10.3f %6.1f%%\n", op.c_str(), static_cast<long long>(r.count), r.ms,
                  total > 0 ? 100.0 * r.ms / total : 0.0);
    out += buf;
  }
  // The GEMMs: where the matmul time goes and how far each shape is from the tensor cores' peak.
  std::map<std::string, Row> gemms;
  std::map<std::string, double> gemmFlops;
  for (const TimedLaunch& l : launches) {
    if (l.gemm.empty()) continue;
    Row& r = gemms[l.gemm];
    ++r.count;
    r.ms += l.ms;
    gemmFlops[l.gemm] += l.flops;
  }
  if (!gemms.empty()) {
    std::vector<std::pair<std::string, Row>> byTime(gemms.begin(), gemms.end());
    std::stable_sort(byTime.begin(), byTime.end(), [](const auto& a, const auto& b) { return a.second.ms > b.second.ms; });
    out += "  GEMMs (cuBLASLt) and fused attention (cuDNN), by time:\n";
    for (const auto& [g, r] : byTime) {
      std::snprintf(buf, sizeof buf, "  %9lld %10.3f ms %7.1f TFLOP/s  %s\n", static_cast<long long>(r.count), r.ms,
                    r.ms > 0 ? gemmFlops[g] / (r.ms * 1e-3) / 1e12 : 0.0, g.c_str());
      out += buf;
    }
  }
  std::vector<size_t> order(launches.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return launches[a].ms > launches[b].ms; });
  if (top > 0 && !order.empty()) {
    std::snprintf(buf, sizeof buf, "  the %d slowest launches:\n", std::min<int>(top, static_cast<int>(order.size())));
    out += buf;
    for (size_t i = 0; i < order.size() && i < static_cast<size_t>(top); ++i) {
      std::snprintf(buf, sizeof buf, "  %10.3f ms  %s\n", launches[order[i]].ms, launches[order[i]].what.c_str());
      out += buf;
    }
  }
  return out;
}

namespace {

// A CSV field: quoted (quotes doubled) where it holds a comma, a quote or a line break.
std::string csvField(const std::string& s) {
  if (s.find_first_of(",\"\n\r") == std::string::npos) return s;
  std::string q = "\"";
  for (char c : s) q += c == '"' ? std::string("\"\"") : std::string(1, c);
  return q + "\"";
}

}  // namespace

std::string formatStepProfileCsv(const std::vector<std::pair<int, std::vector<TimedLaunch>>>& gpus) {
  std::string out = "gpu,launch,op,ms,tflops,what,gemm\n";
  char num[64];
  for (const auto& [gpu, launches] : gpus) {
    for (size_t i = 0; i < launches.size(); ++i) {
      const TimedLaunch& l = launches[i];
      out += cat(gpu, ",", i, ",", csvField(l.op), ",");
      std::snprintf(num, sizeof num, "%.6f", l.ms);
      out += num;
      out += ",";
      if (l.flops > 0 && l.ms > 0) {
        std::snprintf(num, sizeof num, "%.1f", l.flops / (l.ms * 1e-3) / 1e12);
        out += num;
      }
      out += cat(",", csvField(l.what), ",", csvField(l.gemm), "\n");
    }
  }
  return out;
}

}  // namespace tpc::cuda
