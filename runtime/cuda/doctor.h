// `tpc doctor` on a CUDA build: the environment check Megatron users do by hand. GPUs and driver, the CUDA
// runtime, NVRTC, cuBLASLt and NCCL versions (and where NCCL was found), the peer-access topology between
// GPUs, a measured bf16 matmul rate (what the GPU really sustains; `tpc run`'s MFU divides by the dense
// datasheet peak) and, with two or more GPUs, NCCL's all-reduce bus bandwidth. Warnings say what will hurt.
#pragma once

#include <ostream>

namespace tpc::cuda {

// Prints the report; returns the number of warnings (0: all good).
int runDoctor(std::ostream& out, int matmulSize = 8192);

}  // namespace tpc::cuda
