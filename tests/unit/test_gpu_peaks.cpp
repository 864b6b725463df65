// The peak `tpc run`'s MFU divides by: the GPU the driver names, its dense figure for the precision, and a label
// that says which GPU it is (an H100 run was labelled "H200" until the twenty-seventh session).
#include <catch2/catch.hpp>

#include "runtime/gpu_peaks.h"

namespace tpc {

TEST_CASE("gpu peaks: the driver's GPU name picks its dense peak and the label names it", "[run]") {
  PeakFlops p = peakFlopsFor("NVIDIA H100 80GB HBM3", "bf16");
  CHECK(p.flops == 989e12);
  CHECK(p.label == "H100 dense bf16 989 TFLOP/s");
  p = peakFlopsFor("NVIDIA H200", "fp16");
  CHECK(p.flops == 989e12);
  CHECK(p.label == "H200 dense fp16 989 TFLOP/s");
  p = peakFlopsFor("NVIDIA H200", "fp32");
  CHECK(p.flops == 67e12);
  CHECK(p.label == "H200 fp32 67 TFLOP/s");
  // The more specific names win over the family's: a PCIe H100 is not an SXM one.
  p = peakFlopsFor("NVIDIA H100 PCIe", "bf16");
  CHECK(p.flops == 756e12);
  CHECK(p.label == "H100 PCIe dense bf16 756 TFLOP/s");
  CHECK(peakFlopsFor("NVIDIA H100 NVL", "bf16").flops == 835e12);
  CHECK(peakFlopsFor("NVIDIA GH200 480GB", "bf16").label == "GH200 dense bf16 989 TFLOP/s");
  p = peakFlopsFor("NVIDIA A100-SXM4-80GB", "fp32");
  CHECK(p.flops == 19.5e12);
  CHECK(p.label == "A100 fp32 19.5 TFLOP/s");
}

TEST_CASE("gpu peaks: a GPU not in the table gets the H200's peak, and the label says it was assumed", "[run]") {
  PeakFlops p = peakFlopsFor("NVIDIA GeForce RTX 4090", "bf16");
  CHECK(p.flops == 989e12);
  CHECK(p.label == "H200 dense bf16 989 TFLOP/s, assumed: NVIDIA GeForce RTX 4090 is not in tpc's table");
  CHECK(peakFlopsFor("", "bf16").label == "H200 dense bf16 989 TFLOP/s, assumed: the GPU's name is unknown");
}

}  // namespace tpc
