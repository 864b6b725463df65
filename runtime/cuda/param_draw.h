// Parameters drawn on the GPU. initParam (runtime/param_init.h) returns an f32 normal(0, std) parameter
// deferred (HostTensor::pendingNormalDraw); the CUDA backend then runs this kernel into the parameter's
// device buffer instead of drawing 4 bytes an element on the host and uploading them (gpt2-xl: 6 GB). The
// kernel pastes the host's draw code (normalDrawSource(), runtime/normal_draw.h), so both give the same bits.
#pragma once

#include <cstdint>

#include "runtime/cuda/kernel_spec.h"

namespace tpc::cuda {

// tpc_param_normal_draw(float* out, long long n, long long key, float scale): out[i] = scale *
// tpc_normal_draw(tpc_splitmix64(key + i)) for i in [0, n). Args: Result 0, Int64 n, Int64 key (the
// 64-bit key's bits), Float scale; a grid-stride loop over at most `maxBlocks` blocks of 256 threads.
KernelSpec normalDrawKernel(int64_t n, uint64_t key, float scale, uint32_t maxBlocks = 132 * 8);

}  // namespace tpc::cuda
