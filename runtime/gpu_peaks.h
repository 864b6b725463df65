// The dense (no sparsity) tensor-core peak of a GPU, by the name the driver reports, for the MFU that `tpc run`
// logs: the peak a step's model FLOPs are divided by, and the label naming it.
#pragma once

#include <string>

namespace tpc {

struct PeakFlops {
  double flops = 0;   // per second, one GPU
  std::string label;  // e.g. "H100 dense bf16 989 TFLOP/s"
};

// gpuName: cudaDeviceProp::name (e.g. "NVIDIA H100 80GB HBM3"); precision: fp32, fp16 or bf16. A GPU not in the
// table (or no name) gets the H200's peak, and the label says that it was assumed and for which GPU.
PeakFlops peakFlopsFor(const std::string& gpuName, const std::string& precision);

}  // namespace tpc
