// Nodes gathered into buckets by a key (what a multi-tensor kernel bakes in): the buckets in order of their
// first node, the nodes of each in the order they were added. Used to form the multi-tensor AdamW and cast
// groups (adamw_groups.h, cast_groups.h).
#pragma once

#include <map>
#include <vector>

#include "ir/graph.h"

namespace tpc::cuda {

template <class Key>
class OrderedBuckets {
 public:
  void add(const Key& key, Node* n) {
    auto [it, fresh] = index_.try_emplace(key, buckets_.size());
    if (fresh) buckets_.emplace_back();
    buckets_[it->second].push_back(n);
  }
  std::vector<std::vector<Node*>>& buckets() { return buckets_; }

 private:
  std::map<Key, size_t> index_;
  std::vector<std::vector<Node*>> buckets_;
};

}  // namespace tpc::cuda
