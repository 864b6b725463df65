#include "runtime/gpu_peaks.h"

#include <cstdio>

namespace tpc {
namespace {

// NVIDIA's datasheet figures, dense: 16-bit tensor-core and fp32 (non-tensor) TFLOP/s. More specific names first
// ("H100 PCIe" before "H100"): the first entry whose key the device name contains wins.
struct Entry {
  const char* key;
  const char* shortName;
  double tf16, tf32;
};
constexpr Entry kPeaks[] = {
    {"H100 PCIe", "H100 PCIe", 756, 51}, {"H100 NVL", "H100 NVL", 835, 60}, {"H200 NVL", "H200 NVL", 835, 60},
    {"GH200", "GH200", 989, 67},         {"H200", "H200", 989, 67},         {"H100", "H100", 989, 67},
    {"H800", "H800", 989, 67},           {"A100", "A100", 312, 19.5},
};
constexpr Entry kAssumed = {"H200", "H200", 989, 67};  // the GPU tpc is tuned for, where the name is not above

std::string tflops(double tf) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", tf);
  return buf;
}

}  // namespace

PeakFlops peakFlopsFor(const std::string& gpuName, const std::string& precision) {
  const Entry* e = nullptr;
  for (const Entry& c : kPeaks)
    if (gpuName.find(c.key) != std::string::npos) {
      e = &c;
      break;
    }
  const Entry& use = e ? *e : kAssumed;
  const bool fp32 = precision == "fp32";
  const double tf = fp32 ? use.tf32 : use.tf16;
  PeakFlops p;
  p.flops = tf * 1e12;
  p.label = std::string(use.shortName) + (fp32 ? std::string(" fp32 ") : " dense " + precision + " ") + tflops(tf) +
            " TFLOP/s";
  if (!e)
    p.label += gpuName.empty() ? ", assumed: the GPU's name is unknown" : ", assumed: " + gpuName + " is not in tpc's table";
  return p;
}

}  // namespace tpc
