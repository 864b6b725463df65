// Lowering one IR node for the CUDA backend: how the executor runs it, and for kernel nodes the
// NodeLowering (the kernel family's, else the generated one). Pure: no CUDA calls.
#pragma once

#include <functional>

#include "ir/graph.h"
#include "runtime/cuda/kernel_spec.h"

namespace tpc::cuda {

enum class NodeExec {
  Kernels,     // lowerNode() gives the kernels
  Matmul,      // cuBLASLt (runtime/cuda/cublaslt_matmul.h)
  Collective,  // across ranks (an axis of size > 1): the executor's collective code
  View,        // the result is operand 0's bytes in the same order (isView): it aliases them, nothing runs
};

// A movement node whose result is a prefix of its operand's row-major bytes, in the same order: a reshape,
// a transpose that only moves size-1 dims, a slice from 0 with only size-1 dims before its axis, a concat
// of one operand, a broadcast_to that only adds size-1 dims.
bool isView(const Node& n);

NodeExec nodeExec(const Node& n);
// The graph rewrites the CUDA backend applies to each rank's program before lowering it (passes/ that
// the CPU reference does not run): pack-qkv-attention, fold-batch-matmul-sum, then fold-matmul-epilogues
// for the candidates `canRunEpilogue` accepts (none when it is empty), fold-layer-norm-grad-residual (unless
// `foldLayerNormGradResidual` is false), fold-layer-norm-grad-bias-sum for the layer_norm_grads
// `canSumLayerNormGradDx` accepts (none when it is empty), fold-layer-norm-residual for the layer_norms
// `canAddLayerNormResidual` accepts (none when it is empty) and global-norm-skip-casts.
Status rewriteForCuda(Graph& g, const std::function<bool(const Node&)>& canRunEpilogue = {},
                      bool foldLayerNormGradResidual = true,
                      const std::function<bool(const Node&)>& canSumLayerNormGradDx = {},
                      const std::function<bool(const Node&)>& canAddLayerNormResidual = {});
// Whether a bias sum of `d` is the residual stream's (d an add, or a layer_norm_grad's dx, through reshapes):
// with both layer_norm_grad folds on, the layer_norm_grad kernel that writes that stream sums it as it goes
// (sum_dx), so the CUDA backend leaves it out of bgrad_a.
bool residualStreamGradient(const Value* d);
// The kernels of a Kernels node; a collective over an axis of size 1 is lowered as a copy.
Result<NodeLowering> lowerNode(const Node& n, const LoweringContext& ctx);

}  // namespace tpc::cuda
