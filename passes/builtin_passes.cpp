// The one place where tpc's own passes are registered (STYLE.md #4: the driver is a list of registrations).
#include "passes/builtin_passes.h"

#include "passes/pass_registry.h"

namespace tpc {

namespace {

// Wraps an option-less factory.
template <std::unique_ptr<Pass> (*Create)()>
Result<std::unique_ptr<Pass>> plain(const PassOptions&) {
  return Create();
}

}  // namespace

void registerBuiltinPasses(PassRegistry& r) {
  (void)r.add({"cse", "merges nodes that compute the same thing (op, operands, attributes, types, placements)", {},
               plain<createCSEPass>});
  (void)r.add({"dce", "removes nodes whose results no graph output needs", {}, plain<createDCEPass>});
  (void)r.add({"fold-vocab-padding",
               "the loss reads vocab-padded logits whole (cross_entropy num_classes) instead of a sliced copy, and "
               "its gradient comes out padded instead of concatenated with zeros",
               {}, plain<createFoldVocabPaddingPass>});
  (void)r.add({"inference", "the forward graph as evaluation runs it: dropout becomes the identity", {},
               plain<createInferencePass>});
  (void)r.add({"autodiff",
               "rewrites a forward graph into its training step: forward, backward, global-norm clipping, AdamW",
               {{"accum", "micro-batches per step (inputs get a leading [accum] dim when > 1); default 1"},
                {"clip-grad", "global-norm clipping threshold, 0 disables; default 1.0"},
                {"beta1", "AdamW beta1; default 0.9"},
                {"beta2", "AdamW beta2; default 0.95"},
                {"eps", "AdamW epsilon; default 1e-8"},
                {"weight-decay", "AdamW decoupled weight decay, for parameters of rank >= 2 not named *.bias; default 0.1"},
                {"loss", "the forward output to minimize; default loss"},
                {"loss-scale", "true: dynamic loss scaling (fp16): input %loss_scale seeds the backward, gradients "
                               "are unscaled before clipping; default false"}},
               createAutodiffPass});
  (void)r.add({"mixed-precision",
               "casts the forward graph's compute to bf16 (or f16) at each use of an f32 value; parameters, AdamW "
               "state and the loss stay f32 (after the sharding policies, before autodiff)",
               {{"dtype", "bf16 | f16; default bf16"}}, createMixedPrecisionPass});
  (void)r.add({"recompute",
               "activation recomputation (after autodiff, cse and dce): forward values the backward reads are "
               "recomputed per transformer block (h.N.) instead of kept",
               {{"mode", "full (only block boundaries kept) | selective (matmul and attention outputs kept too); "
                         "default full"}},
               createRecomputePass});
  (void)r.add({"fold-batch-matmul-sum",
               "one rank's program: reduce_sum(matmul(a, d) {transpose_a}) over the batch axes becomes one matmul of "
               "a and d flattened to [rows, K] and [rows, N] (weight gradients without a [B, K, N] intermediate)",
               {}, plain<createFoldBatchMatmulSumPass>});
  (void)r.add({"fold-layer-norm-grad-residual",
               "one rank's program: add(residual, dx) after a layer_norm_grad whose dx nothing else reads becomes the "
               "layer_norm_grad's residual operand (one kernel writes dx + residual: the backward residual stream)",
               {}, plain<createFoldLayerNormGradResidualPass>});
  (void)r.add({"fold-layer-norm-residual",
               "one rank's program: a layer_norm of add(t, r), or of a bias GEMM that adds the residual r as C, takes r "
               "as its residual operand (one kernel writes t + r and normalizes it; the GEMM no longer reads r)",
               {}, [](const PassOptions&) -> Result<std::unique_ptr<Pass>> { return createFoldLayerNormResidualPass(); }});
  (void)r.add({"fold-layer-norm-grad-bias-sum",
               "one rank's program: reduce_sum(dx) over the leading dims after a layer_norm_grad becomes its sum_dx "
               "result (the kernel writing dx also sums it: the bias gradients read off the residual stream)",
               {}, [](const PassOptions&) -> Result<std::unique_ptr<Pass>> { return createFoldLayerNormGradBiasSumPass(); }});
  (void)r.add({"pack-qkv-attention",
               "one rank's program: attention (and its gradient) reads q, k, v from the QKV projection's layout and "
               "writes [B, T, H, Dh] (attention_qkv): no transposes, slices, zero-padded concats or adds around it",
               {}, plain<createPackQkvAttentionPass>});
  // Run by name, it folds what cuBLASLt runs: bgrad_a is the CUDA backend's, which folds it where its own GEMM
  // kernel takes it (a bgrad_a left for cuBLASLt would have no epilogue to run as).
  (void)r.add({"fold-matmul-epilogues",
               "one rank's program: bias adds (with a residual add), gelu, gelu_grad and bias sums around a matmul "
               "become matmul_epilogue nodes, each one cuBLASLt call with an epilogue (the CUDA backend runs it)",
               {}, [](const PassOptions&) -> Result<std::unique_ptr<Pass>> {
                 return createFoldMatmulEpiloguesPass([](const Node& n) { return n.getStr("epilogue") != "bgrad_a"; });
               }});
  (void)r.add({"global-norm-skip-casts",
               "one rank's program: global_norm reads bf16/f16 gradients instead of their exact f32 casts (same "
               "norm; the casts left for the clip multiply fold into the CUDA backend's AdamW kernel)",
               {}, plain<createGlobalNormSkipCastsPass>});
  (void)r.add({"hoist-collectives",
               "one rank's program: each collective moves up to just after its operand's producer (collectives keep "
               "their order), so that the nodes it passes run while it does on the CUDA backend's communication stream",
               {}, plain<createHoistCollectivesPass>});
  (void)r.add({"megatron-tp",
               "Megatron tensor parallelism (before autodiff): QKV/fc1 by column (attention by heads), proj/fc2 by row, "
               "the embedding/LM head by vocab",
               {{"tp", "tensor-parallel size (mesh axis tp)"}}, createMegatronTpPass});
  (void)r.add({"data-parallel", "splits the batch inputs over mesh axis dp (gradients all-reduced by the engine)",
               {{"dp", "data-parallel size (mesh axis dp)"}, {"zero1", "ZeRO-1: shard the AdamW moments and the update over dp (reduce_scatter + all_gather); default false"}},
               createDataParallelPass});
  (void)r.add({"sequence-parallel",
               "Megatron sequence parallelism on tp (after megatron-tp, before autodiff): the residual stream split on seq",
               {}, plain<createSequenceParallelPass>});
  (void)r.add({"sharding-propagate", "gives every value a placement from the per-op rules", {},
               plain<createShardingPropagatePass>});
  (void)r.add({"fuse-classifier",
               "cross_entropy and cross_entropy_grad of the same logits become one cross_entropy_with_grad: the loss "
               "and dlogits from one read of the logits, dlogits written over them (one rank's program, before fuse)",
               {}, plain<createFuseClassifierPass>});
  (void)r.add({"fuse",
               "groups connected elementwise nodes over one shape into fusion groups (fusion_group=N), each one CUDA "
               "kernel with its intermediates in registers (last, after partition; the CPU backend ignores them)",
               {}, plain<createFusePass>});
  (void)r.add({"partition", "propagation, then the program of one rank: local shapes and collectives",
               {{"rank", "the rank (row-major over the mesh axes, last fastest); default 0"}}, createPartitionPass});
}

}  // namespace tpc
