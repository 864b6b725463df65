#include "passes/random_space.h"

#include "ir/assert.h"

namespace tpc {
namespace {

std::vector<int64_t> intsOr(const AttrDict& a, std::string_view name) {
  const Attr* v = a.find(name);
  return v ? v->ints() : std::vector<int64_t>{};
}

}  // namespace

std::vector<int64_t> ownRandomSpace(const Node& n) {
  switch (n.op()) {
    case OpKind::Dropout: {
      if (n.getFloat("p") == 0.0) return {};
      const Shape& s = n.result()->shape();
      return {s.begin(), s.end()};
    }
    case OpKind::Attention:
    case OpKind::AttentionGrad: {
      if (n.getFloat("dropout") == 0.0) return {};
      const Shape& q = n.operand(n.op() == OpKind::Attention ? 0 : 1)->shape();  // [B, H, T, D]
      return {q[0], q[1]};
    }
    case OpKind::AttentionQkv: {
      if (n.getFloat("dropout") == 0.0) return {};
      const Shape& out = n.result(0)->shape();  // [B, T, H, D]
      return {out[0], out[2]};
    }
    case OpKind::AttentionQkvGrad: {
      if (n.getFloat("dropout") == 0.0) return {};
      const Shape& out = n.operand(2)->shape();
      return {out[0], out[2]};
    }
    default: return {};
  }
}

void stackRandomSpace(AttrDict& a, const Node& n, int64_t copy, int64_t copies) {
  std::vector<int64_t> own = ownRandomSpace(n);
  if (own.empty() || copies == 1) return;
  std::vector<int64_t> gs = intsOr(a, "global_shape"), off = intsOr(a, "offsets");
  if (gs.empty()) {
    gs = own;
    off.assign(own.size(), 0);
  }
  TPC_ASSERT(gs.size() == off.size() && !gs.empty(), "global_shape and offsets of different ranks");
  off[0] += copy * gs[0];
  gs[0] *= copies;
  a.set("global_shape", gs);
  a.set("offsets", off);
}

void placeRandomShard(AttrDict& a, const std::vector<int64_t>& unsharded, const std::vector<int64_t>& shardOffsets) {
  std::vector<int64_t> gs = intsOr(a, "global_shape"), off = intsOr(a, "offsets");
  if (gs.empty()) {
    gs = unsharded;
    off.assign(unsharded.size(), 0);
  }
  TPC_ASSERT(gs.size() == shardOffsets.size() && off.size() == shardOffsets.size(),
             "a shard's offsets and the node's global_shape of different ranks");
  for (size_t d = 0; d < off.size(); ++d) off[d] += shardOffsets[d];
  a.set("global_shape", gs);
  a.set("offsets", off);
}

}  // namespace tpc
