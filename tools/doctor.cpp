// `tpc doctor`: checks the machine for training (runtime/cuda/doctor.h): GPUs, driver and library versions,
// GPU topology, a measured bf16 matmul rate and NCCL bandwidth; exit 1 when something will hurt.
#include <iostream>

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
                   "warnings when something will hurt a run.");
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
  std::cout << "this tpc was built without CUDA (no toolkit at configure time): CPU backend only\n";
  return 0;
#endif
}

cli::SubcommandRegistration reg("doctor", "check GPUs, drivers, libraries, topology and speed for training",
                                runDoctorCommand);

}  // namespace
}  // namespace tpc
