// `tpc doctor`: checks the machine for training (runtime/cuda/doctor.h): GPUs, driver and library versions,
// GPU topology, a measured bf16 matmul rate and NCCL bandwidth; exit 1 when something will hurt.
#include <algorithm>
#include <iostream>
#include <thread>

#include "runtime/backend_select.h"
#include "tools/cli.h"
#include "tpc/version.h"
#ifdef TPC_HAVE_CUDA
#include "runtime/cuda/doctor.h"
#endif

namespace tpc {
namespace {

int runDoctorCommand(std::vector<std::string> args) {
  cli::Flags flags("doctor",
                   "tpc doctor [--matmul-size N]\n\n"
                   "Checks this machine for training: GPUs, driver, CUDA/NVRTC/cuBLASLt/NCCL versions, peer access\n"
                   "between GPUs, a measured bf16 matmul rate and (2+ GPUs) NCCL all-reduce bandwidth. Exit 1 with\n"
                   "warnings when something will hurt a run (no usable GPU for a CUDA build; a GPU that a build\n"
                   "without CUDA cannot use). A build without CUDA on a machine without an NVIDIA GPU says so and\n"
                   "exits 0: the CPU backend is all there is to use.");
  flags.value("matmul-size", "the N of the N x N x N bf16 matmul timed", "8192");
  int rc = 0;
  if (!flags.parse(args, rc)) return rc;
  if (!flags.positional().empty()) return cli::fail("doctor", "unexpected argument '" + flags.positional()[0] + "'");
  auto n = flags.getInt("matmul-size", 256, 32768);
  if (!n) return cli::fail("doctor", n.error());
  std::cout << "tpc " << TPC_VERSION << "\n";
#ifdef TPC_HAVE_CUDA
  int warnings = cuda::runDoctor(std::cout, static_cast<int>(*n));
  std::cout << (warnings ? std::to_string(warnings) + " warning(s)" : std::string("no problems found")) << "\n";
  return warnings ? 1 : 0;
#else
  std::cout << "this tpc was built without CUDA (no toolkit at configure time): CPU backend only, "
            << std::max(1u, std::thread::hardware_concurrency()) << " CPU threads (tpc run --threads 0 uses them all)\n";
  // The build cannot ask CUDA; the kernel driver's list of GPUs tells whether there is one to miss.
  std::vector<std::string> gpus = nvidiaGpusOnHost();
  if (gpus.empty()) {
    std::cout << "GPUs: none (no NVIDIA driver lists one in /proc/driver/nvidia/gpus); nothing to fix for CPU runs\n"
              << "no problems found\n";
    return 0;
  }
  std::string names;
  for (const std::string& g : gpus) names += (names.empty() ? "" : ", ") + g;
  std::cout << "  warning: this machine has " << gpus.size() << " NVIDIA GPU(s) (" << names
            << ") that this tpc cannot use: install the CUDA toolkit and rebuild (bash scripts/setup.sh)\n"
            << "1 warning(s)\n";
  return 1;
#endif
}

cli::SubcommandRegistration reg("doctor", "check GPUs, drivers, libraries, topology and speed for training",
                                runDoctorCommand);

}  // namespace
}  // namespace tpc
