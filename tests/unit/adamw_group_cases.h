// Multi-tensor AdamW (runtime/cuda/adamw_groups.h, lowerAdamWGroup) against the per-tensor adamw_update
// kernels, shared by the CPU-emulator test (tests/unit) and the GPU test (tests/gpu): tensors of random sizes
// (tiny, odd, more than one chunk), results out of place and in place, buffers 16-byte aligned and not; the
// same bits as the per-tensor kernels, and a gated step (a non-finite loss or grad_norm, or the hold word)
// that leaves every tensor as it was. A Device runs kernels on "device" memory (host memory under the
// emulator, GPU memory on the GPU).
#pragma once

#include <cmath>
#include <cstring>
#include <algorithm>
#include <random>
#include <tuple>

#include "cuda_kernel_cases.h"
#include "runtime/cuda/adamw_groups.h"

namespace tpc::test::adamw {

struct Device {
  virtual ~Device() = default;
  virtual char* alloc(size_t bytes) = 0;  // freed with the device
  virtual void upload(char* dst, const void* src, size_t bytes) = 0;
  virtual void download(void* dst, const char* src, size_t bytes) = 0;
  // `hold` is both the hold word and the fresh word (ArgKind::FreshPtr): no kernel reads both.
  virtual void launch(const cuda::KernelSpec& k, const std::vector<void*>& ops, const std::vector<void*>& res, int hold) = 0;
};

struct GroupCase {
  std::unique_ptr<Graph> graph;
  std::vector<Node*> nodes;
  FusionGroup group;
  std::vector<HostTensor> inputs;  // one per group input (the group's layout), as the device holds them
  std::vector<HostTensor> grads;   // clipped: each node's gradient operand, float(g) * scale, as the mul writes it
};

// The clip scale a clipped case's group reads (what clip_scale would give for a norm of 2.7 and max_norm 1).
constexpr float kClipScale = 0.37037036f;

// adamw_update nodes on params of dtype `pdt` (grads too; moments f32), one per size, weight decay on every
// other one, gated by a loss and a grad_norm (graph inputs returned as those outputs) of the given values.
// `clipped`: each gradient is mul(cast(g: bf16) {to=f32}, clip_scale(grad_norm)), as autodiff writes it under
// mixed precision, so that the group absorbs the cast and the multiply (params f32 then). `copies`: the params
// are graph parameters, each cast to bf16 (the forward's copy) and replaced by its p' output, so that the group
// keeps their bf16 copies (adamwGroupKeepsCopies: a fourth result per tensor).
inline GroupCase makeGroupCase(DType pdt, const std::vector<int64_t>& sizes, std::mt19937& rng, float loss = 2.5f,
                               float gradNorm = 0.7f, bool clipped = false, bool copies = false) {
  GroupCase c;
  c.graph = std::make_unique<Graph>("adamw");
  Graph& g = *c.graph;
  const TensorType s(DType::f32, {});
  Value* lr = g.addInput("lr", s);
  Value* step = g.addInput("step", s);
  Value* lossV = g.addInput("loss_in", s);
  Value* normV = g.addInput("norm_in", s);
  g.addOutput(lossV, "loss");
  g.addOutput(normV, "grad_norm");
  Value* scale = nullptr;
  if (clipped) {
    pdt = DType::f32;
    auto cs = g.create(OpKind::ClipScale, {normV}, [] { AttrDict a; a.set("max_norm", 1.0); return a; }());
    if (!cs.ok()) FAIL(cs.error());
    scale = (*cs)->result();
  }
  for (size_t k = 0; k < sizes.size(); ++k) {
    std::string i = std::to_string(k);
    TensorType pt(pdt, {sizes[k]}), ft(DType::f32, {sizes[k]});
    Value* grad = g.addInput("g" + i, clipped ? TensorType(DType::bf16, {sizes[k]}) : pt);
    if (clipped) {
      auto cast = g.create(OpKind::Cast, {grad}, [] { AttrDict a; a.set("to", DType::f32); return a; }());
      if (!cast.ok()) FAIL(cast.error());
      auto mul = g.create(OpKind::Mul, {(*cast)->result(), scale});
      if (!mul.ok()) FAIL(mul.error());
      grad = (*mul)->result();
    }
    Value* p = copies ? g.addParam("p" + i, pt) : g.addInput("p" + i, pt);
    if (copies) {
      auto cast = g.create(OpKind::Cast, {p}, [] { AttrDict a; a.set("to", DType::bf16); return a; }());
      if (!cast.ok()) FAIL(cast.error());
      g.addOutput((*cast)->result(), "copy" + i);
    }
    Value* ops[] = {p, grad, g.addInput("m" + i, ft), g.addInput("v" + i, ft), lr, step};
    AttrDict a;
    a.set("beta1", 0.9);
    a.set("beta2", 0.95);
    a.set("eps", 1e-8);
    a.set("weight_decay", k % 2 ? 0.0 : 0.1);
    auto n = g.create(OpKind::AdamWUpdate, {ops[0], ops[1], ops[2], ops[3], ops[4], ops[5]}, std::move(a));
    if (!n.ok()) FAIL(n.error());
    c.nodes.push_back(*n);
    for (unsigned r = 0; r < 3; ++r) g.addOutput((*n)->result(r), copies && r == 0 ? "p" + i : "out" + i + "_" + std::to_string(r));
  }
  std::vector<FusionGroup> groups = cuda::adamwGroups(g, nullptr, copies);
  REQUIRE(groups.size() == 1);
  REQUIRE(groups[0].members == c.nodes);
  REQUIRE(cuda::adamwGroupGates(groups[0]) == 2);
  REQUIRE(cuda::adamwGroupScales(groups[0]) == clipped);
  REQUIRE(groups[0].absorbed.size() == (clipped ? 2 * sizes.size() : 0));
  REQUIRE(cuda::adamwGroupKeepsCopies(groups[0]) == copies);
  c.group = std::move(groups[0]);
  for (const Value* v : c.group.inputs) {
    if (v == scale) c.inputs.push_back(HostTensor::scalarF32(kClipScale));
    else if (v == lr) c.inputs.push_back(HostTensor::scalarF32(1.5e-3f));
    else if (v == step) c.inputs.push_back(HostTensor::scalarF32(3));
    else if (v == lossV) c.inputs.push_back(HostTensor::scalarF32(loss));
    else if (v == normV) c.inputs.push_back(HostTensor::scalarF32(gradNorm));
    else {
      bool moment2 = v->name()[0] == 'v', moment1 = v->name()[0] == 'm';
      c.inputs.push_back(kernels::uniformT(v->type(), rng, moment2 ? 0 : moment1 ? -0.1 : -1, moment2 ? 0.01 : moment1 ? 0.1 : 1));
    }
  }
  for (size_t k = 0; clipped && k < sizes.size(); ++k) {
    const HostTensor& raw = c.inputs[4 * k + 1];
    HostTensor f(TensorType(DType::f32, raw.type().shape));
    for (int64_t e = 0; e < raw.numel(); ++e) f.data<float>()[e] = static_cast<float>(raw.getAsDouble(e)) * kClipScale;  // an f32 product
    c.grads.push_back(std::move(f));
  }
  return c;
}

// Node k's operand j as the per-tensor kernel and the CPU backend read it (the gradient after the clip).
inline const HostTensor& nodeOperand(const GroupCase& c, size_t k, size_t j) {
  return j == 1 && !c.grads.empty() ? c.grads[k] : c.inputs[4 * k + j];
}

// Bytes of `t` on the device at an offset of `skew` bytes (4: not 16-byte aligned).
inline char* put(Device& d, const HostTensor& t, size_t skew) {
  char* p = d.alloc(t.bytes() + 16) + skew;
  d.upload(p, t.raw(), t.bytes());
  return p;
}
inline std::string get(Device& d, const char* p, size_t bytes) {
  std::string s(bytes, '\0');
  d.download(s.data(), p, bytes);
  return s;
}
inline std::string bytesOf(const HostTensor& t) { return std::string(reinterpret_cast<const char*>(t.raw()), t.bytes()); }

// Each node's results by the per-tensor kernel (p', m', v' of node k at 3k..3k+2).
inline std::vector<std::string> perTensor(Device& d, const GroupCase& c) {
  std::vector<std::string> out;
  const size_t T = c.nodes.size();
  for (size_t k = 0; k < T; ++k) {
    auto low = (*cuda::findFamilyLowering(OpKind::AdamWUpdate))(*c.nodes[k], kernels::sm90());
    REQUIRE(low.ok());
    std::vector<void*> ops, res;
    for (size_t j = 0; j < 4; ++j) ops.push_back(put(d, nodeOperand(c, k, j), 0));
    for (size_t j = 0; j < 2; ++j) ops.push_back(put(d, c.inputs[4 * T + j], 0));
    for (const Value* r : c.nodes[k]->results()) {
      HostTensor nan(r->type());
      std::memset(nan.raw(), 0xff, nan.bytes());
      res.push_back(put(d, nan, 0));
    }
    for (const cuda::KernelSpec& ks : low->kernels) d.launch(ks, ops, res, 0);
    for (unsigned r = 0; r < 3; ++r)
      out.push_back(get(d, static_cast<char*>(res[r]), static_cast<size_t>(c.nodes[k]->result(r)->type().bytes())));
  }
  return out;
}

// Results per tensor: p', m', v', and the bf16 copy when the group keeps one.
inline size_t resultsPerTensor(const GroupCase& c) { return cuda::adamwGroupKeepsCopies(c.group) ? 4 : 3; }

// The group's results by the multi-tensor kernel: out of place (results start as NaN bytes) or in place
// (p', m', v' in the buffers of p, m, v; a copy in its own, from NaN bytes), every buffer `skew` bytes past a
// 16-byte boundary.
inline std::vector<std::string> multiTensor(Device& d, const GroupCase& c, bool inPlace, size_t skew, int hold) {
  auto low = cuda::lowerAdamWGroup(c.group, kernels::sm90());
  REQUIRE(low.ok());
  REQUIRE(low->kernels.size() == 1);
  std::vector<void*> ops, res;
  for (const HostTensor& t : c.inputs) ops.push_back(put(d, t, skew));
  const size_t R = resultsPerTensor(c);
  for (size_t i = 0; i < c.group.outputs.size(); ++i) {
    if (inPlace && i % R < 3) {
      res.push_back(ops[4 * (i / R) + (i % R == 0 ? 0 : i % R + 1)]);  // p' -> p, m' -> m, v' -> v
      continue;
    }
    HostTensor nan(c.group.outputs[i]->type());
    std::memset(nan.raw(), 0xff, nan.bytes());
    res.push_back(put(d, nan, skew));
  }
  d.launch(low->kernels[0], ops, res, hold);
  std::vector<std::string> out;
  for (size_t i = 0; i < res.size(); ++i)
    out.push_back(get(d, static_cast<char*>(res[i]), static_cast<size_t>(c.group.outputs[i]->type().bytes())));
  return out;
}

// The multi-tensor results against the CPU backend's adamw_update, node by node (cuda_kernel_cases.h's tolerance).
inline void checkAgainstCpu(const GroupCase& c, const std::vector<std::string>& got) {
  const size_t T = c.nodes.size();
  for (size_t k = 0; k < T; ++k) {
    const Node& n = *c.nodes[k];
    std::vector<TensorType> types;
    for (const Value* v : n.operands()) types.push_back(v->type());
    kernels::Case cs{"adamw_update", OpKind::AdamWUpdate, types, n.attrs(), nullptr};
    std::vector<HostTensor> in;
    for (size_t j = 0; j < 4; ++j) in.push_back(nodeOperand(c, k, j));
    in.push_back(c.inputs[4 * T]);
    in.push_back(c.inputs[4 * T + 1]);
    std::vector<HostTensor> want = kernels::runCpu(cs, in, 0, 0);
    std::vector<HostTensor> mine;
    for (unsigned r = 0; r < 3; ++r) {
      HostTensor t(n.result(r)->type());
      std::memcpy(t.raw(), got[resultsPerTensor(c) * k + r].data(), t.bytes());
      mine.push_back(t);
    }
    OneOp o = oneOp(OpKind::AdamWUpdate, types, n.attrs());
    INFO("tensor " << k << " against the CPU backend");
    kernels::compareResults(o, mine, want);
  }
}

// The checks, on tensors of sizes `base` and `random` more drawn in [1, maxRandom]; returns how many tensors
// were compared.
inline int checkAdamWGroups(Device& d, const std::vector<int64_t>& base, int random, int64_t maxRandom) {
  int compared = 0;
  std::mt19937 rng(2024);
  for (auto [pdt, clipped, copies] :
       {std::tuple{DType::f32, false, false}, {DType::bf16, false, false}, {DType::f32, true, false}, {DType::f32, true, true}}) {
    std::vector<int64_t> sizes = base;
    for (int k = 0; k < random; ++k) sizes.push_back(1 + static_cast<int64_t>(rng() % static_cast<uint64_t>(maxRandom)));
    std::shuffle(sizes.begin(), sizes.end(), rng);
    INFO(dtypeName(pdt) << " params" << (clipped ? ", bf16 gradients cast and clipped inside the group" : "")
                        << (copies ? ", bf16 copies kept" : "") << ", sizes " << shapeStr(sizes));
    GroupCase c = makeGroupCase(pdt, sizes, rng, 2.5f, 0.7f, clipped, copies);
    std::vector<std::string> want = perTensor(d, c);
    const size_t R = resultsPerTensor(c);
    if (copies) {  // the copy: cast(p') to bf16, the bits the cast kernel gives (as the CPU backend's cast)
      std::vector<std::string> with;
      for (size_t k = 0; k < sizes.size(); ++k) {
        HostTensor p(TensorType(DType::f32, {sizes[k]}));
        std::memcpy(p.raw(), want[3 * k].data(), p.bytes());
        for (size_t r = 0; r < 3; ++r) with.push_back(want[3 * k + r]);
        with.push_back(bytesOf(p.convertTo(DType::bf16)));
      }
      want = std::move(with);
    }
    for (bool inPlace : {false, true})
      for (size_t skew : {size_t{0}, size_t{4}}) {
        INFO((inPlace ? "in place" : "out of place") << ", buffers " << skew << " bytes past 16-byte alignment");
        std::vector<std::string> got = multiTensor(d, c, inPlace, skew, 0);
        REQUIRE(got.size() == want.size());
        if (!inPlace && skew == 0) checkAgainstCpu(c, got);
        for (size_t i = 0; i < got.size(); ++i) {
          INFO("tensor " << i / R << " (" << sizes[i / R] << " elements), result " << i % R);
          CHECK(got[i] == want[i]);
        }
        compared += static_cast<int>(sizes.size());
      }
    // Gated: the state as it was, in place or not, for a NaN loss, an infinite grad_norm, or the hold word.
    for (auto [loss, norm, hold] : {std::tuple<float, float, int>{NAN, 0.7f, 0}, {2.5f, INFINITY, 0}, {2.5f, 0.7f, 1}}) {
      INFO("loss " << loss << ", grad_norm " << norm << ", hold " << hold);
      std::mt19937 again(7);
      GroupCase g = makeGroupCase(pdt, sizes, again, loss, norm, clipped, copies);
      for (bool inPlace : {false, true}) {
        std::vector<std::string> got = multiTensor(d, g, inPlace, 0, hold);
        for (size_t i = 0; i < got.size(); ++i) {
          INFO("tensor " << i / R << ", result " << i % R << (inPlace ? " in place" : " out of place"));
          if (i % R == 3) CHECK(got[i] == std::string(got[i].size(), '\xff'));  // the copy: untouched
          else CHECK(got[i] == bytesOf(g.inputs[4 * (i / R) + (i % R == 0 ? 0 : i % R + 1)]));
        }
      }
    }
  }
  return compared;
}

}  // namespace tpc::test::adamw
