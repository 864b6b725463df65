// `tpc doctor` in a build without CUDA: it names the NVIDIA GPUs the driver lists (which this build cannot use,
// exit 1) or says there are none (exit 0), as its --help documents.
#include <catch2/catch.hpp>

#include <filesystem>

#include "runtime/backend_select.h"
#include "test_support.h"

namespace tpc {

TEST_CASE("doctor: the GPUs the NVIDIA driver lists are read from its proc folder", "[doctor]") {
  test::TempDir proc;
  CHECK(nvidiaGpusOnHost(proc.path.string()).empty());  // no driver
  std::filesystem::create_directories(proc / "driver/nvidia/gpus/0000:2a:00.0");
  std::filesystem::create_directories(proc / "driver/nvidia/gpus/0000:18:00.0");
  test::writeFile(proc / "driver/nvidia/gpus/0000:18:00.0/information",
                  "Model: \t\t NVIDIA H100 80GB HBM3\nIRQ:   \t\t 100\nGPU UUID: \t GPU-1\n");
  // In bus order; a GPU whose information file cannot be read is named by its bus id.
  CHECK(nvidiaGpusOnHost(proc.path.string()) == std::vector<std::string>{"NVIDIA H100 80GB HBM3", "0000:2a:00.0"});
}

TEST_CASE("doctor: a build without CUDA says whether there is a GPU it cannot use, and exits as documented",
          "[doctor][cli]") {
  auto help = test::runCommand(test::tpcBinary() + " doctor --help");
  CHECK(help.exitCode == 0);
  CHECK(help.out.find("exits 0: the CPU backend is all there is to use") != std::string::npos);
  if (cudaBackendBuilt()) return;  // the CUDA build's checks run on the GPU machine (scripts/gpu_check.sh)
  auto r = test::runCommand(test::tpcBinary() + " doctor");
  INFO(r.out << r.err);
  CHECK(r.err.empty());
  CHECK(r.out.find("built without CUDA (no toolkit at configure time): CPU backend only, ") != std::string::npos);
  if (nvidiaGpusOnHost().empty()) {
    CHECK(r.exitCode == 0);
    CHECK(r.out.find("\nGPUs: none (no NVIDIA driver lists one in /proc/driver/nvidia/gpus)") != std::string::npos);
    CHECK(r.out.find("\nno problems found\n") != std::string::npos);
  } else {
    CHECK(r.exitCode == 1);
    CHECK(r.out.find("  warning: this machine has ") != std::string::npos);
    CHECK(r.out.find("that this tpc cannot use: install the CUDA toolkit and rebuild") != std::string::npos);
  }
}

}  // namespace tpc
