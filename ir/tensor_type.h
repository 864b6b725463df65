// TensorType: a dtype and a static shape. A rank-0 tensor is a scalar, printed `f32[]`.
#pragma once

#include <string>
#include <vector>

#include "llvm/ADT/ArrayRef.h"
#include "llvm/ADT/SmallVector.h"
#include "ir/dtype.h"

namespace tpc {

using Shape = llvm::SmallVector<int64_t, 4>;

struct TensorType {
  DType dtype = DType::f32;
  Shape shape;

  TensorType() = default;
  TensorType(DType d, Shape s) : dtype(d), shape(std::move(s)) {}

  int64_t rank() const { return static_cast<int64_t>(shape.size()); }
  int64_t numel() const;
  int64_t bytes() const { return numel() * dtypeSize(dtype); }
  bool operator==(const TensorType& o) const { return dtype == o.dtype && shape == o.shape; }
  bool operator!=(const TensorType& o) const { return !(*this == o); }
  std::string str() const;  // "f32[8,1024]"
};

std::string shapeStr(llvm::ArrayRef<int64_t> shape);  // "[8,1024]"
// Whether the product of the dims (non-negative) overflows int64: numel() and every shape rule multiply them.
bool numelOverflows(llvm::ArrayRef<int64_t> shape);

}  // namespace tpc
