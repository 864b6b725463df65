// Shape and dtype inference: one rule per op (named after its ops.def Enum), which is also the op's
// verifier rule: it rejects operands, attributes and meshes the op cannot take, with a message saying why.
#pragma once

#include <vector>

#include "ir/attr.h"
#include "ir/mesh.h"
#include "ir/op.h"
#include "ir/status.h"
#include "ir/tensor_type.h"
#include "llvm/ADT/ArrayRef.h"

namespace tpc {

// Checks `attrs` against the op's schema: unknown names, wrong kinds, missing required attributes.
Status checkAttrs(OpKind op, const AttrDict& attrs);

// Infers the result types of `op` applied to operands of the given types. Assumes checkAttrs passed.
Result<std::vector<TensorType>> inferTypes(OpKind op, llvm::ArrayRef<TensorType> operands, const AttrDict& attrs,
                                           const Mesh& mesh);

// numpy-style broadcast of two shapes, or an error naming both.
Result<Shape> broadcastShapes(llvm::ArrayRef<int64_t> a, llvm::ArrayRef<int64_t> b);
// Normalizes a possibly negative axis against rank, or errors.
Result<int64_t> normalizeAxis(int64_t axis, int64_t rank);

// attention_qkv's packed operand: qkv transposed by `perm` is [3, B, H, T, Dh]. The sizes, and the
// row-major element strides of qkv's dims in that order (which: q, k or v; batch; head; token); Dh is last.
struct PackedQkv {
  int64_t B, H, T, D;
  int64_t sWhich, sBatch, sHead, sToken;
};
// Errors when perm is not a permutation of 5 dims ending in 4, or qkv's dim perm[0] is not 3.
Result<PackedQkv> packedQkv(llvm::ArrayRef<int64_t> qkvShape, llvm::ArrayRef<int64_t> perm);

}  // namespace tpc
