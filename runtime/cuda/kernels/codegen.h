// Building blocks for the CUDA C that tpc generates: C types and load/store expressions per dtype
// (computing in float for 16-bit floats, i64 for integers), grid-stride geometry, and the index
// arithmetic from a flat output index to a strided operand offset. Used by the generated lowerings
// (elementwise, movement, constants, collectives); the kernel families write their own CUDA C.
#pragma once

#include <string>
#include <vector>

#include "ir/graph.h"
#include "runtime/cuda/kernel_spec.h"

namespace tpc::cuda::codegen {

std::string ctype(DType t);                 // storage type: float, bf16_t, i32, u8, ...
std::string computeType(DType t);           // float (f32/bf16/f16), double (f64), i64 (integers and bool)
std::string load(DType t, const std::string& ptr);               // value of *ptr in computeType(t)
std::string store(DType t, const std::string& ptr, const std::string& v);  // statement writing v to *ptr
// v (in any compute type) as storing it to dtype t and loading it back gives, in computeType(t): how a fused
// kernel keeps an intermediate in a register with exactly the value an unfused kernel would have stored.
std::string roundTrip(DType t, const std::string& v);

// The source of one kernel: the device prelude, then `body`.
std::string withPrelude(const std::string& body);
// Grid-stride launch geometry for n elements.
void elementwiseGeometry(KernelSpec& k, int64_t n);
// A stable kernel name from a prefix and a hash of the body, so equal sources share one cubin.
std::string entryName(const std::string& prefix, const std::string& body);

// Row-major strides, and the strides of `shape` broadcast to `out` (0 on broadcast dims).
std::vector<int64_t> strides(llvm::ArrayRef<int64_t> shape);
std::vector<int64_t> broadcastStrides(llvm::ArrayRef<int64_t> shape, llvm::ArrayRef<int64_t> out);

// A kernel copying an index space of `dims` elementwise: dst[dbase + sum idx*ds] = src[sbase + sum idx*ss].
// Pointers are Operand/Result args unless `rawPointers` (then Int64 args holding device addresses,
// set by the caller: the virtual-rank collectives).
KernelSpec stridedCopy(DType t, llvm::ArrayRef<int64_t> dims, int64_t dbase, llvm::ArrayRef<int64_t> ds, int64_t sbase,
                       llvm::ArrayRef<int64_t> ss, KernelArg dst, KernelArg src);

}  // namespace tpc::cuda::codegen
