// Reverse-mode autodiff over the IR and the training step it builds (forward, backward, global-norm
// clipping, AdamW), as one graph: a pure function (params, optimizer state, batch, lr) -> (new params,
// new state, loss). VJP rules, one per op, are in passes/vjp_rules.cpp, found by the op's ops.def name.
#pragma once

#include <string>
#include <vector>

#include "ir/graph.h"
#include "ir/status.h"
#include "llvm/ADT/ArrayRef.h"

namespace tpc {

struct TrainingStepOptions {
  std::string lossOutput = "loss";  // the forward graph's output to minimize (a scalar f32[])
  int64_t accumSteps = 1;           // micro-batches per step (gradient accumulation, unrolled in the graph)
  double clipGrad = 1.0;            // global-norm clipping; 0 disables
  double beta1 = 0.9, beta2 = 0.95, eps = 1e-8;
  double weightDecay = 0.1;         // applied to parameters of rank >= 2 not named *.bias
  bool dynamicLossScale = false;    // fp16: the backward is seeded with input %loss_scale, grads unscaled
};

// The most forward ops an unrolled step holds (micro-batches x the forward's ops): `accum` above it is an error.
inline constexpr int64_t kMaxUnrolledForwardNodes = 1 << 19;

// Appends to `g` the backward of scalar `loss` and returns d(loss)/d(v) for each of `wrt` (a zero-filled
// value for one that `loss` does not depend on). `seed`, when given, is the loss's cotangent (a scalar;
// the loss scale): the results are then seed * d(loss)/d(v). `scope`, when given, holds (in program order) every
// node `loss` depends on: only those are visited (a micro-batch of an unrolled step, not the whole step so far).
Result<std::vector<Value*>> appendGradients(Graph& g, Value* loss, llvm::ArrayRef<Value*> wrt, Value* seed = nullptr,
                                            llvm::ArrayRef<Node*> scope = {});

// Rewrites forward graph `g` into the training step:
//   inputs:  each forward input with a leading [accumSteps] dim when accumSteps > 1, [%loss_scale f32[]
//            with dynamicLossScale,] then %lr f32[] and %step f32[] (1-based, for Adam's bias correction);
//   params:  the forward params, then for each p: "<p>.adam_m" and "<p>.adam_v" (f32, init=zeros);
//   outputs: "loss" (mean over micro-batches), "grad_norm" (before clipping), then one output per
//            parameter and moment, named exactly like the parameter it replaces.
Status buildTrainingStep(Graph& g, const TrainingStepOptions& options);

}  // namespace tpc
