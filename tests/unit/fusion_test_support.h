// For the fusion tests (CPU, CUDA lowering, GPU): a small GPT training step, optionally fused, and the
// structural checks every fused graph must pass.
#pragma once

#include <catch2/catch.hpp>

#include <set>

#include "gpt_step_support.h"
#include "ir/fusion_group.h"

namespace tpc::test {

// A 2-layer GPT's training step (batch 4 x 16), in fp32 or with bf16 compute; fused with the fuse pass.
inline std::unique_ptr<Graph> fusionGptStep(bool bf16, bool dropout, bool fuse) {
  GptConfig g = smallGpt();
  g.heads = 8;
  g.paddedVocab = 128;
  g.hiddenDropout = g.attentionDropout = dropout ? 0.1 : 0.0;
  return gptStep(g, 4, std::string(bf16 ? "mixed-precision(dtype=bf16)," : "") + kTrainPasses + (fuse ? ",fuse" : ""));
}

// Every member is elementwise with the group's shape; members are connected through member-to-member operands;
// no input of the group depends on one of its members (a path through a non-member, e.g. a matmul).
inline void checkGroupStructure(const Graph& g, const FusionGroup& fg) {
  INFO("fusion_group=" << fg.id);
  std::set<const Node*> member(fg.members.begin(), fg.members.end());
  REQUIRE(fg.members.size() >= 2);
  for (const Node* m : fg.members) {
    CHECK(m->has(traits::Elementwise));
    CHECK(m->result()->shape() == fg.shape);
  }
  // Connectivity (undirected, member edges only).
  std::set<const Node*> seen = {fg.members.front()};
  for (bool grew = true; grew;) {
    grew = false;
    for (const Node* m : fg.members)
      for (const Value* v : m->operands())
        if (v->def() && member.count(v->def()) && seen.count(m) != seen.count(v->def())) {
          seen.insert(m);
          seen.insert(v->def());
          grew = true;
        }
  }
  CHECK(seen.size() == fg.members.size());
  // What depends on the members, through non-members: none of it may feed the group.
  auto users = g.computeUsers();
  std::set<const Node*> downstream;
  std::vector<const Node*> work(fg.members.begin(), fg.members.end());
  while (!work.empty()) {
    const Node* n = work.back();
    work.pop_back();
    for (const Value* r : n->results())
      for (const Node* u : users.lookup(r))
        if (!member.count(u) && downstream.insert(u).second) work.push_back(u);
  }
  for (const Value* in : fg.inputs) CHECK((in->def() == nullptr || !downstream.count(in->def())));
}

}  // namespace tpc::test
