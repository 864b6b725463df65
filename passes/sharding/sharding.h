// The sharding engine (one for all policies): per-op placement rules, propagation over the whole training
// step, and the partitioner that rewrites the annotated global graph into one rank's program (local shapes,
// rank-specific constants, collectives where a producer's placement differs from what its consumer needs).
// Policies (megatron-tp, data-parallel, sequence-parallel) only annotate params, inputs and a few values.
#pragma once

#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "ir/graph.h"
#include "ir/status.h"
#include "llvm/ADT/ArrayRef.h"
#include "llvm/ADT/SmallVector.h"

namespace tpc {

namespace sharding {

// One way to run a node along one mesh axis: the placement each operand must have and what each result
// then has. `vocabParallel`: cross entropy (grad) on logits split on the class dim, lowered to the
// vocab-parallel loss pieces instead of gathering the logits.
struct AxisStrategy {
  llvm::SmallVector<AxisPlacement, 6> in;
  llvm::SmallVector<AxisPlacement, 3> out;
  bool vocabParallel = false;
};

// The strategies of node `n` along one axis (of size `axisSize`) worth trying, given the operands' current
// placements on that axis; the engine adds "everything replicated" (always valid) and picks the cheapest.
std::vector<AxisStrategy> axisCandidates(const Node& n, llvm::ArrayRef<AxisPlacement> in, int64_t axisSize);

// The shape one rank holds of a value of global type `t` under `p`.
Shape localShape(const Shape& global, const Placement& p, const Mesh& mesh);

// This rank's coordinate on each mesh axis (row-major over mesh.axes, last axis fastest).
std::vector<int64_t> rankCoords(const Mesh& mesh, int64_t rank);

}  // namespace sharding

// Gives every value of `g` a placement from the per-op rules, starting from the placements the policies
// set on params, inputs and hinted values (unplaced params adopt what their first consumer needs; unplaced
// inputs are replicated; a hint on a node's result constrains only the mesh axes it lists). Folds a padded-vocab `slice` before cross entropy into the loss op first.
Status propagatePlacements(Graph& g);

// One rank's program of an annotated (propagated) graph: local shapes, rank constants baked in, collectives
// inserted. Params and inputs keep their global names, the mesh and their placements (the runtime slices
// unsharded state and batches by them).
Result<std::unique_ptr<Graph>> partitionForRank(const Graph& annotated, int64_t rank);

// Every rank's program of a graph with placement hints (propagatePlacements over `g`, then partitionForRank),
// or only rank `onlyRank`'s (one process per rank).
Result<std::vector<std::unique_ptr<Graph>>> partitionRanks(Graph& g, std::optional<int64_t> onlyRank = std::nullopt);

// slice(embedding_grad(..), axis 0) on a rank's program becomes embedding_grad of those rows only
// (local_folds.cpp); the dead nodes are left for the caller to drop.
void foldSlicedEmbeddingGrads(Graph& local);

// megatron-tp's QKV projection (a matmul batched over the q, k, v blocks of the [D, 3, D] view) and its
// gradients read the rank's [D, 3, D/tp] block as one packed [D, 3D/tp] matrix again, as on one rank: one
// GEMM each way, no per-block reduce_sums or transposes, and the one-rank folds (bias epilogues, the packed
// attention layout) apply (local_folds.cpp). The dead nodes are left for the caller to drop.
void foldStackedQkv(Graph& local);

// add(x, z) => x where z is one of `zeros`: the zeros a rank other than the axis's first holds for a
// replicated value turned partial (the partitioner's R -> P: rank 0 holds the value, the others 0), e.g. the
// row-parallel bias and the residual before the all-reduce. Only the first rank adds them.
void foldZeroShareAdds(Graph& local, const std::set<const Value*>& zeros);

// Sets `v`'s placement on `axis` for a policy; a different placement already set there by another policy
// is an error naming the value, the axis and both placements.
Status annotatePlacement(Value* v, const std::string& axis, AxisPlacement p, const std::string& policy);

// ZeRO-1 over mesh axis dp (distributed_optimizer.cpp): splits every AdamW moment over dp on the first dim
// its param is not split on and dp divides, and hints the param's gradient to the same placement. Returns
// the params whose moments stay replicated over dp (no such dim).
Result<std::vector<std::string>> shardOptimizerStateOverDp(Graph& g, int64_t dp);

// An error naming `pass` when `g` holds collectives: a rank's program (partition's output), whose shapes are already
// its blocks; sharding it again would split them again.
Status checkNotPartitioned(const Graph& g, const std::string& pass);

// Adds axis `name` of `size` to `g`'s mesh, or checks that an existing one has that size (and that `g` is not a
// rank's program).
Status ensureMeshAxis(Graph& g, const std::string& name, int64_t size, const std::string& policy);

}  // namespace tpc
