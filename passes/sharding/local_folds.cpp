// Folds on a rank's program that the engine's one-sweep choices leave behind: a replicated value computed
// whole only for the rank to slice its block out of it.
#include "passes/sharding/sharding.h"

namespace tpc {

// slice(embedding_grad(dy, ids){vocab=V, vocab_start=s}, axis 0, a, b) => embedding_grad(dy, ids){vocab=b-a,
// vocab_start=s+a}: under vocab-parallel tp (without sp) the tied wte's gradient from the embedding is
// otherwise computed for the whole vocab on every rank and sliced to the rank's rows.
void foldSlicedEmbeddingGrads(Graph& local) {
  auto users = local.computeUsers();
  for (Node* s : local.nodeVector()) {
    if (s->op() != OpKind::Slice || s->getInt("axis") != 0) continue;
    Node* eg = s->operand(0)->def();
    if (!eg || eg->op() != OpKind::EmbeddingGrad || users.lookup(eg->result()).size() != 1 || local.isOutput(eg->result()))
      continue;
    int64_t start = s->getInt("start"), end = s->getInt("end");
    AttrDict a = eg->attrs();
    a.set("vocab", end - start);
    a.set("vocab_start", eg->getInt("vocab_start") + start);
    auto n = local.create(OpKind::EmbeddingGrad, {eg->operand(0), eg->operand(1)}, std::move(a), s);
    if (!n.ok()) continue;  // types disagree: leave the slice
    if (s->result()->hasName()) (*n)->result()->setName(s->result()->name());
    local.replaceAllUsesWith(s->result(), (*n)->result());
  }
}

}  // namespace tpc
