// `tpc doctor` on a GPU: the measured matmul rate is put against the peak `tpc run`'s MFU divides by for this
// GPU (runtime/gpu_peaks), not a fixed H200 figure.
#include <catch2/catch.hpp>

#include <sstream>

#include "gpu_test_support.h"
#include "runtime/cuda/device_info.h"
#include "runtime/cuda/doctor.h"
#include "runtime/gpu_peaks.h"

namespace tpc {

TEST_CASE("cuda doctor: the matmul line names this GPU's peak, the one tpc run's MFU uses", "[gpu]") {
  test::requireGpuOrSkip();
  const auto devices = cuda::listDevices();
  REQUIRE_FALSE(devices.empty());
  std::ostringstream out;
  cuda::runDoctor(out, 2048);
  const std::string report = out.str();
  INFO(report);
  CHECK(report.find("GPU 0: " + devices[0].name) != std::string::npos);
  const std::string label = peakFlopsFor(devices[0].name, "bf16").label;
  CHECK(report.find("TFLOP/s measured (") != std::string::npos);
  CHECK(report.find("of the " + label + " peak tpc run's MFU divides by") != std::string::npos);
}

}  // namespace tpc
