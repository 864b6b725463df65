// One training step timed launch by launch (`tpc run --profile-step N`): the GPU time of every launch,
// measured with CUDA events around it outside the step's CUDA graph, summed per op and printed as a
// table (which op families the step's time goes to) plus the slowest single launches. Pure: no CUDA.
#pragma once

#include <string>
#include <vector>

namespace tpc::cuda {

struct TimedLaunch {
  std::string op;    // the row it is summed in: the node's op, "fusion_group=N", "NCCL all_reduce", ...
  std::string what;  // the executor's description: "[rank R: ]op -> %value [kernel entry]" or "NCCL op ..."
  double ms = 0;
  std::string gemm;  // a cuBLASLt or cuDNN launch: its GEMM ("matmul bf16[...] x ...") or attention, and FLOPs; else empty and 0
  double flops = 0;
};

// The table: per op launches, ms and share of the total, slowest first; then the GEMMs (and cuDNN attention calls) by time with their
// TFLOP/s; then the `top` slowest launches.
// `replayMs`: the same step as a CUDA graph replay (0: unknown), printed beside the summed time.
std::string formatStepProfile(const std::vector<TimedLaunch>& launches, int64_t step, double replayMs, int top = 15);

// Every launch of a profiled step, one CSV row each in launch order (`tpc run --profile-csv`), for plotting or
// sorting: `gpu,launch,op,ms,tflops,what,gemm` (tflops empty where the launch is no GEMM or attention call).
// `gpus[i]` names the GPU of launches[i]'s list; the header is written once, before the first list.
std::string formatStepProfileCsv(const std::vector<std::pair<int, std::vector<TimedLaunch>>>& gpus);

}  // namespace tpc::cuda
