// The device-buffer scan of the CUDA backend's checking mode.
#include "runtime/cuda/nonfinite_scan.h"

#include <cuda_runtime_api.h>

#include <cmath>

#include "runtime/host_tensor.h"

namespace tpc::cuda {

Result<std::optional<NonFiniteElement>> firstNonFiniteOnDevice(const Value& v, const void* ptr) {
  if (!isFloat(v.dtype()) || v.type().numel() == 0) return std::optional<NonFiniteElement>();
  if (!ptr) return makeError("cuda: checking mode: value of type ", v.type().str(), " has no device buffer");
  HostTensor t(v.type());
  if (cudaError_t e = cudaMemcpy(t.raw(), ptr, t.bytes(), cudaMemcpyDeviceToHost); e != cudaSuccess)
    return makeError("cuda: checking mode: reading a ", v.type().str(), " value: ", cudaGetErrorString(e));
  const int64_t n = t.numel();
  if (t.dtype() == DType::f32) {  // the common case, without a conversion per element
    const float* f = t.data<float>();
    for (int64_t i = 0; i < n; ++i)
      if (!std::isfinite(f[i])) return std::optional<NonFiniteElement>(NonFiniteElement{i, static_cast<double>(f[i])});
    return std::optional<NonFiniteElement>();
  }
  for (int64_t i = 0; i < n; ++i) {
    double x = t.getAsDouble(i);
    if (!std::isfinite(x)) return std::optional<NonFiniteElement>(NonFiniteElement{i, x});
  }
  return std::optional<NonFiniteElement>();
}

}  // namespace tpc::cuda
