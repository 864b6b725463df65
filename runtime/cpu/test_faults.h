// TPC_TEST_FAULT: how a test asks `tpc run` to inject a CpuFaults fault (cpu_executor.h), e.g.
//   TPC_TEST_FAULT="step=3,nan=%d.wte"     element 0 of %d.wte becomes a NaN at step 3
//   TPC_TEST_FAULT="step=3,nan=%1,nan-rank=1"   ... of %1 on mesh rank 1 alone
//   TPC_TEST_FAULT="step=2,stall-rank=1"   rank 1 stops before its first collective of step 2
// Only tests set it; a malformed value is an error (a test that meant to inject a fault must not pass
// without one).
#pragma once

#include <string>

#include "ir/status.h"
#include "runtime/cpu/cpu_executor.h"

namespace tpc::cpu {

Result<CpuFaults> parseTestFaults(const std::string& spec);

}  // namespace tpc::cpu
