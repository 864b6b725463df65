// Multi-tensor casts (runtime/cuda/cast_groups.h, lowerCastGroup) against the per-node cast kernels and the
// CPU backend's cast, shared by the CPU-emulator test (tests/unit) and the GPU test (tests/gpu): parameters
// of random sizes (tiny, odd, a chunk of 8192 and one more) holding random bit patterns (every exponent,
// zeros, subnormals, infinities, NaNs), buffers 16-byte aligned, not, and some of each, and a grid smaller
// than the chunks (its blocks stride over them). The same bits as the per-node kernels, tensor by tensor.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>

#include "adamw_group_cases.h"
#include "runtime/cuda/cast_groups.h"
#include "runtime/cuda/lowering.h"

namespace tpc::test::castgroup {

using adamw::Device;

struct CastCase {
  std::unique_ptr<Graph> graph;
  std::vector<Node*> casts;
  FusionGroup group;
  std::vector<HostTensor> inputs;  // one per cast, in the group's order
};

// Random bit patterns of dtype `t` (f32, bf16 or f16).
inline HostTensor randomBits(const TensorType& t, std::mt19937& rng) {
  HostTensor h(t);
  if (t.dtype == DType::f32)
    for (int64_t i = 0; i < h.numel(); ++i) h.data<uint32_t>()[i] = static_cast<uint32_t>(rng());
  else
    for (int64_t i = 0; i < h.numel(); ++i) h.data<uint16_t>()[i] = static_cast<uint16_t>(rng());
  return h;
}

// Parameters p0.. of dtype `from`, one per size, each cast to `to` and returned; they form one cast group.
inline CastCase makeCastCase(DType from, DType to, const std::vector<int64_t>& sizes, std::mt19937& rng) {
  CastCase c;
  c.graph = std::make_unique<Graph>("casts");
  Graph& g = *c.graph;
  for (size_t k = 0; k < sizes.size(); ++k) {
    Value* p = g.addParam("p" + std::to_string(k), TensorType(from, {sizes[k]}));
    auto n = g.create(OpKind::Cast, {p}, [to] { AttrDict a; a.set("to", to); return a; }());
    if (!n.ok()) FAIL(n.error());
    c.casts.push_back(*n);
    g.addOutput((*n)->result(), "y" + std::to_string(k));
  }
  std::vector<FusionGroup> groups = cuda::castGroups(g);
  REQUIRE(groups.size() == 1);
  REQUIRE(cuda::isCastGroup(groups[0]));
  REQUIRE(groups[0].members == std::vector<Node*>{c.casts.front()});
  REQUIRE(groups[0].absorbed == std::vector<Node*>(c.casts.begin() + 1, c.casts.end()));
  c.group = std::move(groups[0]);
  for (const Value* v : c.group.inputs) c.inputs.push_back(randomBits(v->type(), rng));
  return c;
}

inline HostTensor nanBytes(const TensorType& t) {
  HostTensor h(t);
  std::memset(h.raw(), 0xff, h.bytes());
  return h;
}

// Each cast by its own (generated) kernel.
inline std::vector<std::string> perNode(Device& d, const CastCase& c) {
  std::vector<std::string> out;
  for (size_t k = 0; k < c.casts.size(); ++k) {
    auto low = cuda::lowerNode(*c.casts[k], kernels::sm90());
    REQUIRE(low.ok());
    std::vector<void*> ops{adamw::put(d, c.inputs[k], 0)}, res{adamw::put(d, nanBytes(c.casts[k]->result()->type()), 0)};
    for (const cuda::KernelSpec& ks : low->kernels) d.launch(ks, ops, res, 0);
    out.push_back(adamw::get(d, static_cast<char*>(res[0]), static_cast<size_t>(c.casts[k]->result()->type().bytes())));
  }
  return out;
}

// The group's kernel, tensor t's buffers skew(t) bytes past a 16-byte boundary, at most `maxBlocks` blocks;
// `kept`/`fresh`: the tensors whose copies the AdamW kernels keep, and the fresh word (lowerCastGroup).
template <class Skew>
std::vector<std::string> multiTensor(Device& d, const CastCase& c, Skew skew, int64_t maxBlocks,
                                     const std::vector<bool>& kept = {}, int fresh = 0) {
  auto low = cuda::lowerCastGroup(c.group, kernels::sm90(), maxBlocks, kept);
  INFO((low.ok() ? std::string() : low.error()));
  REQUIRE(low.ok());
  REQUIRE(low->kernels.size() == 1);
  REQUIRE(low->kernels[0].grid.x <= static_cast<uint32_t>(maxBlocks));
  std::vector<void*> ops, res;
  for (size_t t = 0; t < c.inputs.size(); ++t) {
    ops.push_back(adamw::put(d, c.inputs[t], skew(t)));
    res.push_back(adamw::put(d, nanBytes(c.group.outputs[t]->type()), skew(t)));
  }
  d.launch(low->kernels[0], ops, res, fresh);
  std::vector<std::string> out;
  for (size_t t = 0; t < res.size(); ++t)
    out.push_back(adamw::get(d, static_cast<char*>(res[t]), static_cast<size_t>(c.group.outputs[t]->type().bytes())));
  return out;
}

// The CPU backend's cast of each tensor: the same bits, or NaN where it gives NaN (payloads may differ).
inline void checkAgainstCpu(const CastCase& c, const std::vector<std::string>& got) {
  for (size_t t = 0; t < c.casts.size(); ++t) {
    const Node& n = *c.casts[t];
    kernels::Case cs{"cast", OpKind::Cast, {n.operand(0)->type()}, n.attrs(), nullptr};
    std::vector<HostTensor> want = kernels::runCpu(cs, {c.inputs[t]}, 0, 0);
    REQUIRE(want.size() == 1);
    DType to = n.result()->dtype();
    HostTensor w = want[0].dtype() == to ? want[0] : want[0].convertTo(to);
    HostTensor mine(n.result()->type());
    REQUIRE(got[t].size() == static_cast<size_t>(mine.bytes()));
    std::memcpy(mine.raw(), got[t].data(), mine.bytes());
    int64_t bad = 0, first = -1;
    for (int64_t i = 0; i < w.numel(); ++i) {
      double a = mine.getAsDouble(i), b = w.getAsDouble(i);
      bool same = std::isnan(a) ? std::isnan(b)
                                : std::memcmp(reinterpret_cast<const char*>(mine.raw()) + i * dtypeSize(to),
                                              reinterpret_cast<const char*>(w.raw()) + i * dtypeSize(to), dtypeSize(to)) == 0;
      if (!same && bad++ == 0) first = i;
    }
    INFO("tensor " << t << " (" << w.numel() << " elements) against the CPU backend's cast: " << bad
                   << " elements differ, the first at " << first);
    CHECK(bad == 0);
  }
}

// The checks for tensors of sizes `base` plus `random` more drawn in [1, maxRandom], for each dtype pair;
// returns how many tensors were compared.
inline int checkCastGroups(Device& d, const std::vector<std::pair<DType, DType>>& pairs, const std::vector<int64_t>& base,
                           int random, int64_t maxRandom) {
  int compared = 0;
  std::mt19937 rng(2025);
  for (auto [from, to] : pairs) {
    std::vector<int64_t> sizes = base;
    for (int k = 0; k < random; ++k) sizes.push_back(1 + static_cast<int64_t>(rng() % static_cast<uint64_t>(maxRandom)));
    std::shuffle(sizes.begin(), sizes.end(), rng);
    INFO(dtypeName(from) << " -> " << dtypeName(to) << ", sizes " << shapeStr(sizes));
    CastCase c = makeCastCase(from, to, sizes, rng);
    std::vector<std::string> want = perNode(d, c);
    auto aligned = [](size_t) { return size_t{0}; };
    auto skewed = [](size_t) { return size_t{4}; };
    auto mixed = [](size_t t) { return t % 3 == 1 ? size_t{4} : size_t{0}; };
    std::vector<std::pair<const char*, std::vector<std::string>>> runs;
    runs.emplace_back("aligned", multiTensor(d, c, aligned, 2048));
    runs.emplace_back("4 bytes past alignment", multiTensor(d, c, skewed, 2048));
    runs.emplace_back("every third tensor 4 bytes past alignment", multiTensor(d, c, mixed, 2048));
    runs.emplace_back("aligned, 2 blocks striding over the chunks", multiTensor(d, c, aligned, 2));
    // Every other tensor's copy kept by the AdamW kernels: with the fresh word clear, all are cast.
    std::vector<bool> kept(sizes.size());
    for (size_t t = 0; t < kept.size(); ++t) kept[t] = t % 2 == 0;
    runs.emplace_back("every other tensor kept, the fresh word clear", multiTensor(d, c, aligned, 2048, kept, 0));
    checkAgainstCpu(c, runs[0].second);
    {  // With it set the kept tensors' results are left as they were (NaN bytes here), the rest cast.
      INFO("every other tensor kept, the fresh word set");
      std::vector<std::string> got = multiTensor(d, c, mixed, 64, kept, 1);
      REQUIRE(got.size() == want.size());
      for (size_t t = 0; t < got.size(); ++t) {
        INFO("tensor " << t << " (" << sizes[t] << " elements)");
        CHECK(got[t] == (kept[t] ? std::string(want[t].size(), '\xff') : want[t]));
      }
      INFO("every tensor kept, the fresh word set: nothing written");
      got = multiTensor(d, c, aligned, 2048, std::vector<bool>(sizes.size(), true), 1);
      for (size_t t = 0; t < got.size(); ++t) CHECK(got[t] == std::string(want[t].size(), '\xff'));
    }
    for (const auto& [what, got] : runs) {
      INFO(what);
      REQUIRE(got.size() == want.size());
      for (size_t t = 0; t < got.size(); ++t) {
        INFO("tensor " << t << " (" << sizes[t] << " elements)");
        CHECK(got[t] == want[t]);
      }
      compared += static_cast<int>(got.size());
    }
  }
  return compared;
}

}  // namespace tpc::test::castgroup
