// Cases for the CUDA kernel families (runtime/cuda/kernels): one op per case with several shapes, dtypes
// and attributes, inputs drawn in valid ranges; the CPU backend's results; the comparison
// |got - cpu| <= tol * (|cpu| + rms(cpu)) with tol 1e-5 for f32 results and 1e-2 for bf16/f16 ones (4e-2
// for the tensor-core attention kernels with one 16-bit P: tcAttentionTol).
// Shared by the CI test (NVRTC compile, launch geometry, CPU emulation) and the GPU test (tests/gpu).
#pragma once

#include <cstring>
#include <functional>
#include <optional>
#include <stdexcept>
#include <random>
#include <string>
#include <vector>

#include "cpu_test_helpers.h"
#include "runtime/cuda/kernels/attention.h"
#include "runtime/cuda/kernels/family_lowerings.h"

namespace tpc::test::kernels {

using cuda::ArgKind;
using cuda::KernelSpec;
using cuda::LoweringContext;
using cuda::NodeLowering;

// One op on inputs of given types; `make` draws valid inputs (f32/int HostTensors of the node's dtypes,
// bf16/f16 ones as the 16-bit tensors the GPU reads).
struct Case {
  std::string name;
  OpKind op;
  std::vector<TensorType> types;
  AttrDict attrs;
  std::function<std::vector<HostTensor>(std::mt19937&)> make;
  LoweringContext ctx{};  // what the case is lowered with (an option off, a small GPU)
};

inline HostTensor uniformT(const TensorType& t, std::mt19937& rng, double lo = -1, double hi = 1) {
  HostTensor f = randomTensor(t, rng, false, lo, hi);
  return isFloat(t.dtype) && t.dtype != DType::f32 ? f.convertTo(t.dtype) : f;
}
inline TensorType tt(DType d, Shape s) { return TensorType(d, std::move(s)); }

// Inputs drawn uniformly per operand in [lo, hi).
inline std::function<std::vector<HostTensor>(std::mt19937&)> uniformInputs(std::vector<TensorType> types,
                                                                    std::vector<std::pair<double, double>> ranges) {
  return [types, ranges](std::mt19937& rng) {
    std::vector<HostTensor> v;
    for (size_t k = 0; k < types.size(); ++k) {
      auto [lo, hi] = k < ranges.size() ? ranges[k] : std::pair<double, double>(-1, 1);
      v.push_back(uniformT(types[k], rng, lo, hi));
    }
    return v;
  };
}

inline Case simple(std::string name, OpKind op, std::vector<TensorType> types, AttrDict attrs,
            std::vector<std::pair<double, double>> ranges = {}) {
  auto make = uniformInputs(types, std::move(ranges));
  return Case{std::move(name), op, std::move(types), std::move(attrs), std::move(make)};
}

using tpc::attrs;  // ir/attr.h

inline std::vector<HostTensor> toCpuInputs(const std::vector<HostTensor>& in) {
  std::vector<HostTensor> out;
  for (const HostTensor& t : in) out.push_back(isFloat(t.dtype()) && t.dtype() != DType::f32 ? t.convertTo(DType::f32) : t);
  return out;
}

inline std::vector<HostTensor> runCpu(const Case& c, const std::vector<HostTensor>& inputs, uint64_t seed, int64_t step) {
  OneOp o = oneOp(c.op, c.types, c.attrs);
  CpuOptions opt;
  opt.threads = 2;
  opt.seed = seed;
  auto exec = CpuExecutor::create(*o.graph, opt);
  if (!exec.ok()) FAIL(exec.error());
  std::vector<HostTensor> cpuIn = toCpuInputs(inputs);
  std::vector<const HostTensor*> in;
  for (const HostTensor& t : cpuIn) in.push_back(&t);
  auto r = (*exec)->run(in, {}, step);
  if (!r.ok()) FAIL(r.error());
  return std::move(r).value();
}

// attention_grad's (dout, q, k, v, out, lse): out and lse from the CPU forward of the same attributes.
inline std::function<std::vector<HostTensor>(std::mt19937&)> attentionGradInputs(DType dt, Shape q, Shape k, AttrDict a) {
  return [=](std::mt19937& rng) {
    TensorType qt(dt, q), kt(dt, k);
    HostTensor Q = uniformT(qt, rng), K = uniformT(kt, rng), V = uniformT(kt, rng), dO = uniformT(qt, rng);
    Case fwd{"", OpKind::Attention, {qt, kt, kt}, a, nullptr};
    std::vector<HostTensor> r = runCpu(fwd, {Q, K, V}, 77, 3);
    HostTensor out = dt == DType::f32 ? r[0] : r[0].convertTo(dt);
    return std::vector<HostTensor>{dO, Q, K, V, out, r[1]};
  };
}

// attention_qkv's packed operand: [B, T, 3, H, Dh] for perm [2,0,3,1,4] (the GPT builder's), [B, 3, T, H, Dh]
// for perm [1,0,3,2,4] (megatron-tp's).
inline Shape packedShape(int64_t B, int64_t T, int64_t H, int64_t D, const std::vector<int64_t>& perm) {
  return perm[0] == 2 ? Shape{B, T, 3, H, D} : Shape{B, 3, T, H, D};
}

// attention_qkv_grad's (dout, qkv, out, lse): out and lse from the CPU forward of the same attributes.
inline std::function<std::vector<HostTensor>(std::mt19937&)> attentionQkvGradInputs(DType dt, Shape qkv, Shape o,
                                                                                     AttrDict a) {
  return [=](std::mt19937& rng) {
    TensorType pt(dt, qkv), ot(dt, o);
    HostTensor X = uniformT(pt, rng), dO = uniformT(ot, rng);
    Case fwd{"", OpKind::AttentionQkv, {pt}, a, nullptr};
    std::vector<HostTensor> r = runCpu(fwd, {X}, 77, 3);
    HostTensor out = dt == DType::f32 ? r[0] : r[0].convertTo(dt);
    return std::vector<HostTensor>{dO, X, out, r[1]};
  };
}

inline std::vector<Case> allCases() {
  std::vector<Case> cs;
  const DType f = DType::f32, bf = DType::bf16, h = DType::f16;
  // ---- attention ----
  struct A {
    const char* name;
    DType dt;
    Shape q, k;
    AttrDict a;
  };
  std::vector<A> att = {
      {"causal D64", f, {2, 3, 64, 64}, {2, 3, 64, 64}, attrs({{"causal", true}})},
      {"causal D128 tail tiles", f, {1, 2, 100, 128}, {1, 2, 100, 128}, attrs({{"causal", true}})},
      {"full Tq!=Tk D40 scale", f, {2, 1, 37, 40}, {2, 1, 70, 40}, attrs({{"causal", false}, {"scale", 0.3}})},
      {"causal dropout sharded heads", f, {2, 2, 70, 32}, {2, 2, 70, 32},
       attrs({{"causal", true}, {"dropout", 0.25}, {"key", 9}, {"global_shape", std::vector<int64_t>{4, 6}},
              {"offsets", std::vector<int64_t>{1, 3}}})},
      {"causal bf16 D64", bf, {2, 2, 128, 64}, {2, 2, 128, 64}, attrs({{"causal", true}})},
      {"full f16 D128 dropout", h, {1, 2, 65, 128}, {1, 2, 65, 128},
       attrs({{"causal", false}, {"dropout", 0.1}, {"key", 3}})},
      // bf16/f16 with head_dim % 16 == 0 run the tensor-core kernels (attention_tensor_core.cpp).
      {"tc causal bf16 D64 T1024", bf, {2, 3, 1024, 64}, {2, 3, 1024, 64}, attrs({{"causal", true}})},
      {"tc causal bf16 D128 T1024", bf, {2, 2, 1024, 128}, {2, 2, 1024, 128}, attrs({{"causal", true}})},
      {"tc causal bf16 D128 T77", bf, {2, 2, 77, 128}, {2, 2, 77, 128}, attrs({{"causal", true}})},
      {"tc causal f16 D64 T77 scale", h, {2, 3, 77, 64}, {2, 3, 77, 64}, attrs({{"causal", true}, {"scale", 0.2}})},
      {"tc causal bf16 D64 T77 dropout sharded heads", bf, {3, 2, 77, 64}, {3, 2, 77, 64},
       attrs({{"causal", true}, {"dropout", 0.2}, {"key", 5}, {"global_shape", std::vector<int64_t>{4, 6}},
              {"offsets", std::vector<int64_t>{1, 2}}})},
      {"tc full bf16 D64 Tq!=Tk", bf, {2, 2, 50, 64}, {2, 2, 90, 64}, attrs({{"causal", false}})},
  };
  for (const A& x : att) {
    TensorType qt(x.dt, x.q), kt(x.dt, x.k);
    cs.push_back(simple(cat("attention ", x.name), OpKind::Attention, {qt, kt, kt}, x.a));
    Case g{cat("attention_grad ", x.name), OpKind::AttentionGrad,
           {qt, qt, kt, kt, qt, tt(f, {x.q[0], x.q[1], x.q[2]})}, x.a, attentionGradInputs(x.dt, x.q, x.k, x.a)};
    cs.push_back(std::move(g));
  }
  // ---- attention_qkv: the same kernels on the packed layouts ----
  struct P {
    const char* name;
    DType dt;
    int64_t B, T, H, D;
    std::vector<int64_t> perm;
    AttrDict a;
  };
  const std::vector<int64_t> btshd{2, 0, 3, 1, 4}, bsthd{1, 0, 3, 2, 4};
  std::vector<P> packed = {
      {"causal D32 [B,T,3,H,Dh]", f, 2, 70, 2, 32, btshd, attrs({{"causal", true}})},
      {"causal D64 [B,3,T,H,Dh] dropout sharded heads", f, 2, 65, 2, 64, bsthd,
       attrs({{"causal", true}, {"dropout", 0.25}, {"key", 9}, {"global_shape", std::vector<int64_t>{2, 4}},
              {"offsets", std::vector<int64_t>{0, 2}}})},
      {"tc causal bf16 D64 T77 [B,T,3,H,Dh]", bf, 2, 77, 3, 64, btshd, attrs({{"causal", true}})},
      {"tc causal bf16 D64 T130 [B,3,T,H,Dh] dropout sharded heads", bf, 1, 130, 2, 64, bsthd,
       attrs({{"causal", true}, {"dropout", 0.2}, {"key", 5}, {"global_shape", std::vector<int64_t>{3, 6}},
              {"offsets", std::vector<int64_t>{1, 2}}})},
      {"tc full f16 D128 T65 [B,T,3,H,Dh]", h, 1, 65, 2, 128, btshd, attrs({{"causal", false}, {"scale", 0.2}})},
  };
  for (P& x : packed) {
    x.a.set("perm", x.perm);
    Shape qkv = packedShape(x.B, x.T, x.H, x.D, x.perm), o{x.B, x.T, x.H, x.D};
    cs.push_back(simple(cat("attention_qkv ", x.name), OpKind::AttentionQkv, {tt(x.dt, qkv)}, x.a));
    cs.push_back(Case{cat("attention_qkv_grad ", x.name), OpKind::AttentionQkvGrad,
                      {tt(x.dt, o), tt(x.dt, qkv), tt(x.dt, o), tt(f, {x.B, x.H, x.T})}, x.a,
                      attentionQkvGradInputs(x.dt, qkv, o, x.a)});
  }
  // ---- normalization ----
  for (auto [dt, shape] : std::vector<std::pair<DType, Shape>>{{f, {4, 7, 96}}, {bf, {8, 768}}, {f, {3, 1000}}}) {
    cs.push_back(simple(cat("layer_norm ", tt(dt, shape).str()), OpKind::LayerNorm,
                        {tt(dt, shape), tt(f, {shape.back()}), tt(f, {shape.back()})}, attrs({{"eps", 1e-5}})));
    cs.push_back(simple(cat("layer_norm_grad ", tt(dt, shape).str()), OpKind::LayerNormGrad,
                        {tt(dt, shape), tt(dt, shape), tt(f, {shape.back()})}, attrs({{"eps", 1e-5}})));
  }
  cs.push_back(simple("layer_norm_grad many rows", OpKind::LayerNormGrad, {tt(f, {300, 40}), tt(f, {300, 40}), tt(f, {40})}, {}));
  // Realistic and odd widths: the warp-per-row kernels with 16-byte pieces (768, 1000), elementwise (771), a
  // warp summing several rows of dgamma/dbeta (4000 rows), and the block-per-row kernels (2100 odd, 4096).
  for (auto [dt, gt, shape] : std::vector<std::tuple<DType, DType, Shape>>{{bf, f, {257, 768}},
                                                                          {h, f, {33, 771}},
                                                                          {bf, bf, {9, 1000}},
                                                                          {f, f, {4000, 24}},
                                                                          {f, f, {6, 2100}},
                                                                          {bf, f, {5, 4096}}}) {
    TensorType x = tt(dt, shape), g = tt(gt, {shape.back()});
    cs.push_back(simple(cat("layer_norm ", x.str(), " gamma ", dtypeName(gt)), OpKind::LayerNorm, {x, g, g},
                        attrs({{"eps", 1e-5}}), {{-2, 3}, {0.5, 1.5}, {-1, 1}}));
    cs.push_back(simple(cat("layer_norm_grad ", x.str(), " gamma ", dtypeName(gt)), OpKind::LayerNormGrad, {x, x, g},
                        attrs({{"eps", 1e-5}}), {{-1, 1}, {-2, 3}, {0.5, 1.5}}));
  }
  // layer_norm with a residual operand (fold-layer-norm-residual): the warp kernel with 16-byte pieces (768, 1024),
  // element loads (771), f32 and a row count that leaves a block's warps idle.
  for (auto [dt, shape] : std::vector<std::pair<DType, Shape>>{{bf, {257, 768}}, {h, {33, 771}}, {f, {6, 96}}, {bf, {3, 5, 1024}}}) {
    TensorType x = tt(dt, shape), g = tt(f, {shape.back()});
    cs.push_back(simple(cat("layer_norm residual ", x.str()), OpKind::LayerNorm, {x, g, g, x}, attrs({{"eps", 1e-5}}),
                        {{-2, 3}, {0.5, 1.5}, {-1, 1}, {-1, 1}}));
  }
  // With a residual operand (fold-layer-norm-grad-residual): warp kernels with 16-byte pieces and element loads,
  // the block-per-row kernels.
  for (auto [dt, shape] : std::vector<std::pair<DType, Shape>>{{bf, {257, 768}}, {h, {33, 771}}, {f, {6, 2100}}, {bf, {3, 4, 4096}}}) {
    TensorType x = tt(dt, shape), g = tt(f, {shape.back()});
    cs.push_back(simple(cat("layer_norm_grad residual ", x.str()), OpKind::LayerNormGrad, {x, x, g, x}, attrs({{"eps", 1e-5}}),
                        {{-1, 1}, {-2, 3}, {0.5, 1.5}, {-1, 1}}));
  }
  // The block kernel (LoweringContext::layerNormGradBlocks) with several rows a warp (rows > 2048) and a last
  // block short of rows: odd row counts, widths 1024, 256 (one piece a lane), 40 (lanes idle), 99 (element loads),
  // with and without the residual.
  for (auto [dt, shape, res] : std::vector<std::tuple<DType, Shape, bool>>{{bf, {4201, 256}, false},
                                                                        {bf, {2053, 1024}, true},
                                                                        {f, {2049, 1024}, false},
                                                                        {h, {6151, 40}, true},
                                                                        {f, {3001, 99}, true}}) {
    TensorType x = tt(dt, shape), g = tt(f, {shape.back()});
    std::vector<TensorType> types = {x, x, g};
    if (res) types.push_back(x);
    cs.push_back(simple(cat("layer_norm_grad blocks ", x.str(), res ? " residual" : ""), OpKind::LayerNormGrad, types,
                        attrs({{"eps", 1e-5}}), {{-1, 1}, {-2, 3}, {0.5, 1.5}, {-1, 1}}));
  }
  // sum_dx (fold-layer-norm-grad-bias-sum): dx's column sums (in shared memory by default; the GPU family test
  // also runs them in registers), with and without the residual, several rows a warp, element loads (771).
  for (auto [dt, shape, res] : std::vector<std::tuple<DType, Shape, bool>>{{bf, {2053, 768}, true},
                                                                        {bf, {1031, 1024}, true},
                                                                        {f, {4001, 24}, false},
                                                                        {h, {300, 771}, false},
                                                                        {bf, {3, 5, 256}, false}}) {
    TensorType x = tt(dt, shape), g = tt(f, {shape.back()});
    std::vector<TensorType> types = {x, x, g};
    if (res) types.push_back(x);
    cs.push_back(simple(cat("layer_norm_grad sum_dx ", x.str(), res ? " residual" : ""), OpKind::LayerNormGrad, types,
                        attrs({{"eps", 1e-5}, {"sum_dx", true}}), {{-1, 1}, {-2, 3}, {0.5, 1.5}, {-1, 1}}));
    Case regs = cs.back();
    regs.name += " (sums in registers)";
    regs.ctx.layerNormGradRegColumns = regs.ctx.layerNormGradRegSumColumns = 32;
    cs.push_back(std::move(regs));
  }
  // The block kernel with its rows through a cp.async ring of 2-4 rows a warp (LoweringContext::
  // layerNormGradStages): a last block short of rows; sums in shared memory and in registers; f32 rows (two 16-byte
  // copies a piece); f16; element loads (771: no ring, the register prefetch). `sms` > 0 lowers for a GPU of that
  // many SMs, so that each warp runs tens of rows through its ring (the refills' steady state), not one or two.
  for (auto [dt, shape, res, sumDx, stages, sms] : std::vector<std::tuple<DType, Shape, bool, bool, int, int>>{
           {bf, {2053, 768}, true, true, 3, 0},
           {bf, {2053, 768}, true, false, 2, 0},
           {bf, {600, 768}, true, true, 3, 1},
           {bf, {601, 768}, true, false, 4, 1},
           {bf, {4201, 256}, false, false, 3, 0},
           {bf, {1031, 1024}, true, true, 2, 0},
           {bf, {517, 1024}, true, false, 3, 1},
           {f, {2049, 1024}, false, false, 3, 0},
           {f, {301, 1024}, true, false, 2, 1},
           {h, {6151, 40}, true, true, 3, 0},
           {h, {300, 771}, true, false, 3, 0}}) {
    TensorType x = tt(dt, shape), g = tt(f, {shape.back()});
    std::vector<TensorType> types = {x, x, g};
    if (res) types.push_back(x);
    AttrDict a = attrs({{"eps", 1e-5}});
    if (sumDx) a.set("sum_dx", true);
    cs.push_back(simple(cat("layer_norm_grad ", stages, " stages ", x.str(), res ? " residual" : "", sumDx ? " sum_dx" : "",
                            sms ? cat(" on ", sms, " SM") : std::string()),
                        OpKind::LayerNormGrad, types, a, {{-1, 1}, {-2, 3}, {0.5, 1.5}, {-1, 1}}));
    cs.back().ctx.layerNormGradStages = stages;
    cs.back().ctx.layerNormGradWide = false;  // the stages asked for at 1024 too
    if (sms) cs.back().ctx.numSMs = sms;
    if (sumDx) {
      Case regs = cs.back();
      regs.name += " (sums in registers)";
      regs.ctx.layerNormGradRegColumns = regs.ctx.layerNormGradRegSumColumns = 32;
      cs.push_back(std::move(regs));
    }
  }
  // The default at 1024-wide 16-bit rows (LoweringContext::layerNormGradWide): a ring of 2, every sum in registers.
  for (auto [shape, res, sumDx, sms] : std::vector<std::tuple<Shape, bool, bool, int>>{
           {{1031, 1024}, true, true, 0}, {{517, 1024}, true, false, 1}, {{2049, 1024}, false, false, 0}}) {
    TensorType x = tt(bf, shape), g = tt(f, {shape.back()});
    std::vector<TensorType> types = {x, x, g};
    if (res) types.push_back(x);
    AttrDict a = attrs({{"eps", 1e-5}});
    if (sumDx) a.set("sum_dx", true);
    cs.push_back(simple(cat("layer_norm_grad wide ", x.str(), res ? " residual" : "", sumDx ? " sum_dx" : "",
                            sms ? cat(" on ", sms, " SM") : std::string()),
                        OpKind::LayerNormGrad, types, a, {{-1, 1}, {-2, 3}, {0.5, 1.5}, {-1, 1}}));
    if (sms) cs.back().ctx.numSMs = sms;
  }
  for (auto [dt, shape, axis] : std::vector<std::tuple<DType, Shape, int64_t>>{
           {f, {5, 300}, -1}, {f, {3, 7, 5}, 1}, {bf, {4, 2000}, -1}, {f, {6, 4}, 0}}) {
    cs.push_back(simple(cat("softmax ", tt(dt, shape).str(), " axis ", axis), OpKind::Softmax, {tt(dt, shape)},
                        attrs({{"axis", axis}}), {{-4, 4}}));
    cs.push_back(simple(cat("softmax_grad ", tt(dt, shape).str(), " axis ", axis), OpKind::SoftmaxGrad,
                        {tt(dt, shape), tt(dt, shape)}, attrs({{"axis", axis}}), {{-1, 1}, {0, 1}}));
  }
  // ---- loss ----
  for (auto [dt, it, V, C] : std::vector<std::tuple<DType, DType, int64_t, int64_t>>{
           {f, DType::i32, 50, 0}, {f, DType::i64, 64, 45}, {bf, DType::i32, 1000, 999}}) {
    int64_t classes = C ? C : V;
    Shape rows = {3, 5};
    TensorType lt = tt(dt, {3, 5, V}), tgt = tt(it, rows);
    AttrDict a = attrs({{"ignore_index", int64_t(-1)}, {"num_classes", C}});
    cs.push_back(simple(cat("cross_entropy ", lt.str(), " C=", C), OpKind::CrossEntropy, {lt, tgt}, a,
                        {{-3, 3}, {-1, double(classes - 1)}}));
    cs.push_back(simple(cat("cross_entropy_grad ", lt.str(), " C=", C), OpKind::CrossEntropyGrad,
                        {tt(f, rows), lt, tgt}, a, {{-1, 1}, {-3, 3}, {-1, double(classes - 1)}}));
    cs.push_back(simple(cat("cross_entropy_with_grad ", lt.str(), " C=", C), OpKind::CrossEntropyWithGrad,
                        {tt(f, rows), lt, tgt}, a, {{-1, 1}, {-3, 3}, {-1, double(classes - 1)}}));
  }
  // gpt2's padded vocabulary (bf16, 16-byte loads, the row kept in shared memory), f32 rows of 201 KB (kept:
  // one block per SM), odd widths (element loads), a row too long to keep in shared memory, logits in a
  // wide range (the running max is rescaled often).
  for (auto [dt, rows, V, C, lo, hi] : std::vector<std::tuple<DType, int64_t, int64_t, int64_t, double, double>>{
           {bf, 64, 50304, 50257, -3, 3},
           {f, 5, 50304, 50257, -8, 8},
           {h, 7, 4001, 0, -3, 3},
           {f, 3, 61000, 60999, -3, 3},
           {bf, 6, 3000, 2990, -40, 40}}) {
    int64_t classes = C ? C : V;
    TensorType lt = tt(dt, {rows, V}), tgt = tt(DType::i32, {rows});
    AttrDict a = attrs({{"ignore_index", int64_t(-1)}, {"num_classes", C}});
    cs.push_back(simple(cat("cross_entropy ", lt.str(), " C=", C), OpKind::CrossEntropy, {lt, tgt}, a,
                        {{lo, hi}, {-1, double(classes - 1)}}));
    cs.push_back(simple(cat("cross_entropy_grad ", lt.str(), " C=", C), OpKind::CrossEntropyGrad,
                        {tt(f, {rows}), lt, tgt}, a, {{-1, 1}, {lo, hi}, {-1, double(classes - 1)}}));
    cs.push_back(simple(cat("cross_entropy_with_grad ", lt.str(), " C=", C), OpKind::CrossEntropyWithGrad,
                        {tt(f, {rows}), lt, tgt}, a, {{-1, 1}, {lo, hi}, {-1, double(classes - 1)}}));
  }
  // The row-resident grad kernel (loss_resident.cpp, the default for 16-bit logits with V % 8 == 0): 2051 pieces
  // of 8 for 1024 threads (a short third round), classes ending mid-piece, a one-piece row, f16; on "GPUs" of 1
  // and 2 SMs (a few persistent blocks walking many rows through both buffers, ignored rows among them); every
  // third row with one logit at +30 (the target's or another's). With xentOnePass off: loss.cpp's kernel.
  for (auto [dt, rows, V, C, sms, onePass] : std::vector<std::tuple<DType, int64_t, int64_t, int64_t, int, bool>>{
           {bf, 9, 16408, 16403, 132, true},
           {bf, 23, 1000, 993, 2, true},
           {h, 12, 2048, 2000, 1, true},
           {bf, 10, 8, 5, 2, true},
           {bf, 7, 240, 0, 132, true},
           {bf, 9, 16408, 16403, 132, false},
           {h, 12, 2048, 2000, 1, false}}) {
    int64_t classes = C ? C : V;
    TensorType lt = tt(dt, {rows, V}), tgt = tt(DType::i32, {rows});
    AttrDict a = attrs({{"ignore_index", int64_t(-1)}, {"num_classes", C}});
    for (OpKind op : {OpKind::CrossEntropyGrad, OpKind::CrossEntropyWithGrad}) {
      Case c = simple(cat(opName(op), " ", lt.str(), " C=", C, " ", sms, " SMs dominant", onePass ? "" : " (old)"), op,
                      {tt(f, {rows}), lt, tgt}, a);
      c.make = [types = c.types, classes](std::mt19937& rng) {
        HostTensor x = randomTensor(types[1], rng, false, -3, 3), t = randomTensor(types[2], rng, false, -1, double(classes - 1));
        int64_t V = types[1].shape.back();
        for (int64_t r = 0; r < t.numel(); r += 3) {
          int64_t at = (r / 3) % 2 == 0 && t.getAsDouble(r) >= 0 ? int64_t(t.getAsDouble(r)) : (r * 7919) % classes;
          x.setFromDouble(r * V + at, 30.0);
        }
        return std::vector<HostTensor>{uniformT(types[0], rng), x.convertTo(types[1].dtype), t};
      };
      c.ctx.numSMs = sms;
      c.ctx.xentOnePass = onePass;
      cs.push_back(std::move(c));
    }
  }
  {
    // This rank holds classes [32, 96) of 120 real ones... and [96, 160) holds 24 real ones then padding.
    for (int64_t start : {int64_t(32), int64_t(96)}) {
      TensorType lt = tt(f, {4, 6, 64}), rows = tt(f, {4, 6}), tg = tt(DType::i32, {4, 6});
      AttrDict vs = attrs({{"vocab_start", start}, {"num_classes", int64_t(120)}});
      cs.push_back(simple(cat("vocab_max start=", start), OpKind::VocabMax, {lt}, vs, {{-3, 3}}));
      cs.push_back(simple(cat("vocab_sum_exp start=", start), OpKind::VocabSumExp, {lt, rows}, vs, {{-3, 3}, {2, 3}}));
      cs.push_back(simple(cat("vocab_pick start=", start), OpKind::VocabPick, {lt, tg},
                          attrs({{"vocab_start", start}, {"ignore_index", int64_t(-1)}}), {{-3, 3}, {-1, 119}}));
      cs.push_back(simple(cat("vocab_xent_grad start=", start), OpKind::VocabXentGrad, {rows, lt, rows, rows, tg},
                          attrs({{"vocab_start", start}, {"num_classes", int64_t(120)}, {"ignore_index", int64_t(-1)}}),
                          {{-1, 1}, {-3, 3}, {2, 3}, {20, 40}, {-1, 119}}));
    }
    TensorType rows = tt(f, {4, 6});
    cs.push_back(simple("vocab_loss", OpKind::VocabLoss, {rows, rows, rows, tt(DType::i64, {4, 6})},
                        attrs({{"ignore_index", int64_t(-1)}}), {{2, 3}, {20, 40}, {-3, 3}, {-1, 5}}));
  }
  // ---- gather ----
  for (DType dt : {f, bf}) {
    // Rows of 24 (16-byte accesses, 8 elements a thread) and of 20 (an element a thread).
    for (int64_t D : {24, 20})
      cs.push_back(simple(cat("embedding ", dtypeName(dt), " D ", D), OpKind::Embedding, {tt(dt, {50, D}), tt(DType::i32, {3, 9})},
                          attrs({{"vocab_start", int64_t(10)}}), {{-1, 1}, {0, 70}}));
    cs.push_back(simple(cat("embedding_grad ", dtypeName(dt)), OpKind::EmbeddingGrad,
                        {tt(dt, {4, 333, 24}), tt(DType::i64, {4, 333})},
                        attrs({{"vocab", int64_t(40)}, {"vocab_start", int64_t(5)}}), {{-1, 1}, {0, 50}}));
  }
  cs.push_back(simple("embedding_grad one id everywhere", OpKind::EmbeddingGrad, {tt(f, {2100, 8}), tt(DType::i32, {2100})},
                      attrs({{"vocab", int64_t(3)}}), {{-1, 1}, {1, 1}}));
  // Token-like ids: a few frequent ids (more than 32 positions: summed by 32-entry tiles, some runs starting
  // inside a tile), many rare ones, most of the table unused, some ids outside this shard; widths 768 (gpt2),
  // 1200 (two column chunks), 100 and 37 (element loads); a vocabulary of 9000 rows takes the counts' scan
  // through two rounds of 8192 and a tail.
  for (auto [dt, it, N, V, D] : std::vector<std::tuple<DType, DType, int64_t, int64_t, int64_t>>{
           {bf, DType::i32, 1100, 400, 768}, {f, DType::i64, 700, 300, 1200}, {f, DType::i32, 999, 200, 100},
           {h, DType::i32, 333, 64, 37}, {f, DType::i32, 600, 9000, 8}}) {
    TensorType dy = tt(dt, {N, D}), ids = tt(it, {N});
    AttrDict a = attrs({{"vocab", V}, {"vocab_start", int64_t(2)}});
    cs.push_back(Case{cat("embedding_grad token-like ", dy.str(), " vocab ", V), OpKind::EmbeddingGrad, {dy, ids}, a,
                      [dy, ids, V](std::mt19937& rng) {
                        std::vector<HostTensor> v = {uniformT(dy, rng)};
                        HostTensor t(ids);
                        std::uniform_real_distribution<double> u(0, 1);
                        std::uniform_int_distribution<int64_t> any(0, V + 3);
                        const int64_t frequent[] = {7, 8, V / 2, V + 1};  // V + 1 - 2: in the shard; V + 1: not
                        for (int64_t i = 0; i < t.numel(); ++i) {
                          double p = u(rng);
                          t.setFromDouble(i, static_cast<double>(p < 0.5 ? frequent[static_cast<int>(p * 8)] : any(rng)));
                        }
                        v.push_back(t);
                        return v;
                      }});
  }
  // ---- reductions ----
  struct R {
    OpKind op;
    DType dt;
    Shape s;
    std::vector<int64_t> axes;
    bool keep;
  };
  for (const R& r : std::vector<R>{{OpKind::ReduceSum, f, {64, 33}, {0}, false},
                                   {OpKind::ReduceSum, f, {64, 33}, {1}, true},
                                   {OpKind::ReduceSum, f, {5, 6, 7}, {0, 2}, false},
                                   {OpKind::ReduceSum, bf, {5, 6, 7}, {0, 1, 2}, false},
                                   {OpKind::ReduceSum, f, {4096, 16}, {0}, false},
                                   {OpKind::ReduceSum, DType::i32, {10, 12}, {1}, false},
                                   {OpKind::ReduceMean, f, {8, 9, 10}, {-1, 0}, true},
                                   {OpKind::ReduceMean, f, {3000, 4}, {0}, false},
                                   {OpKind::ReduceMax, f, {8, 9, 10}, {1}, false},
                                   {OpKind::ReduceMax, bf, {70, 3}, {0}, true},
                                   {OpKind::ReduceSum, f, {6, 5}, {}, false},
                                   // bias gradients: leading axes summed, 64 chunks combined by 32 lanes
                                   {OpKind::ReduceSum, bf, {16, 64, 768}, {0, 1}, false},
                                   {OpKind::ReduceSum, f, {8, 129, 100}, {0, 1}, false},
                                   {OpKind::ReduceMax, f, {8, 129, 100}, {0, 1}, false},
                                   // the chunked 16-byte column kernel (leading dims reduced): gpt2's widths,
                                   // row counts that leave a short last chunk, f32/f16, a middle dim (old path)
                                   {OpKind::ReduceSum, bf, {1000, 3072}, {0}, false},
                                   // a thread loads several batches of 8 rows (then a tail) in the one-wave grid
                                   {OpKind::ReduceSum, bf, {4096, 3072}, {0}, false},
                                   {OpKind::ReduceSum, bf, {3, 77, 2304}, {0, 1}, false},
                                   {OpKind::ReduceSum, f, {517, 24}, {0}, false},
                                   {OpKind::ReduceSum, h, {333, 40}, {0}, true},
                                   {OpKind::ReduceMean, bf, {700, 16}, {0}, false},
                                   {OpKind::ReduceMax, bf, {300, 48}, {0}, false},
                                   {OpKind::ReduceSum, f, {4, 30, 8}, {1}, false}}) {
    cs.push_back(simple(cat(opName(r.op), " ", tt(r.dt, r.s).str(), " axes ", shapeStr(r.axes), r.keep ? " keepdims" : ""),
                        r.op, {tt(r.dt, r.s)}, attrs({{"axes", r.axes}, {"keepdims", r.keep}}), {{-5, 5}}));
  }
  for (OpKind op : {OpKind::SumSquares, OpKind::GlobalNorm})
    cs.push_back(simple(cat(opName(op), " of 3"), op, {tt(f, {100}), tt(bf, {33, 7}), tt(f, {70000})}, {}));
  // Many operands of mixed dtypes and sizes (tails shorter than a 16-byte load, tiles over several blocks).
  cs.push_back(simple("global_norm of 9 mixed", OpKind::GlobalNorm,
                      {tt(f, {768}), tt(f, {768, 2304}), tt(h, {1001}), tt(bf, {40000}), tt(f, {3}), tt(bf, {7, 9}),
                       tt(f, {16384}), tt(f, {16385}), tt(h, {64, 50})},
                      {}));
  // ---- optimizer ----
  for (DType dt : {f, bf}) {
    TensorType p = tt(dt, {1000}), s = tt(f, {});
    cs.push_back(simple(cat("adamw_update ", dtypeName(dt)), OpKind::AdamWUpdate, {p, tt(f, {1000}), tt(f, {1000}), tt(f, {1000}), s, s},
                        attrs({{"beta1", 0.9}, {"beta2", 0.95}, {"eps", 1e-8}, {"weight_decay", 0.1}}),
                        {{-1, 1}, {-1, 1}, {-0.1, 0.1}, {0, 0.01}, {1e-3, 2e-3}, {3, 3}}));
  }
  cs.push_back(simple("clip_scale", OpKind::ClipScale, {tt(f, {})}, attrs({{"max_norm", 1.0}}), {{0.5, 3}}));
  return cs;
}

inline LoweringContext sm90() { return LoweringContext{}; }

inline Result<NodeLowering> lowerCase(const Case& c, OneOp& o, const LoweringContext& ctx) {
  const cuda::FamilyLowering* fn = cuda::findFamilyLowering(c.op);
  if (!fn) return makeError("no lowering for ", opName(c.op));
  return (*fn)(*o.node, ctx);
}
inline Result<NodeLowering> lowerCase(const Case& c, OneOp& o) { return lowerCase(c, o, c.ctx); }

// The kernels that a faster one replaced and TPC_MEMBW_OFF=lngrad2,embgrad2 still selects (cuda_backend.cpp):
// layer_norm_grad's warp kernel (a partial row per warp) and embedding_grad's quadratic ranking with a block
// per table row. The new ones give the old dx bits, and the old bits for table rows of at most 32 positions.
inline LoweringContext oldMembwKernels() {
  LoweringContext c;
  c.layerNormGradBlocks = false;
  c.embeddingGradSegments = false;
  return c;
}
// (sum_dx is summed by the block kernel alone: no old variant.)
inline bool hasOldVariant(const Case& c) {
  if (c.op == OpKind::LayerNormGrad) return !c.attrs.find("sum_dx");
  return c.op == OpKind::EmbeddingGrad;
}

// Whether the new kernel's result r must equal the old kernel's bits (see oldMembwKernels): dx of
// layer_norm_grad (all of it: `ok` left empty); embedding_grad's rows with at most 32 positions (`ok[v]` set).
// Both match the CPU backend within the usual tolerance either way.
inline bool oldBitsExpected(const Node& n, size_t r, const std::vector<HostTensor>& in, std::vector<bool>* ok) {
  ok->clear();
  if (n.op() == OpKind::LayerNormGrad) return r == 0;
  if (n.op() != OpKind::EmbeddingGrad) return false;
  int64_t V = n.getInt("vocab"), start = n.getInt("vocab_start");
  std::vector<int64_t> count(static_cast<size_t>(V), 0);
  for (int64_t i = 0; i < in[1].numel(); ++i) {
    int64_t v = static_cast<int64_t>(in[1].getAsDouble(i)) - start;
    if (v >= 0 && v < V) ++count[static_cast<size_t>(v)];
  }
  ok->assign(static_cast<size_t>(V), false);
  for (int64_t v = 0; v < V; ++v) (*ok)[static_cast<size_t>(v)] = count[static_cast<size_t>(v)] <= 32;
  return true;
}

// A layer_norm_grad case with stages (LoweringContext::layerNormGradStages) lowered with its ring and with the
// register prefetch (stages 0); nullopt where the ring does not apply (element loads: STAGES 0 either way).
struct RingLowerings {
  NodeLowering ring, regs;
};
inline std::optional<RingLowerings> ringAndRegisterLowerings(const Case& c, OneOp& o) {
  LoweringContext plain = c.ctx;
  plain.layerNormGradStages = 0;
  plain.layerNormGradWide = false;
  auto ring = lowerCase(c, o), regs = lowerCase(c, o, plain);
  REQUIRE(ring.ok());
  REQUIRE(regs.ok());
  if (ring->kernels[0].source.find("#define STAGES 0\n") != std::string::npos) return std::nullopt;
  return RingLowerings{std::move(ring).value(), std::move(regs).value()};
}

// The ring's results a against the register prefetch's b: every result bit for bit where both grids are the
// same, else dx alone (with fewer blocks a SM, the blocks' partial sums group other rows). Returns whether every
// result was compared.
inline bool checkRingBits(const RingLowerings& l, const std::vector<HostTensor>& a, const std::vector<HostTensor>& b) {
  REQUIRE(a.size() == b.size());
  const bool sameGrid = l.ring.kernels[0].grid.x == l.regs.kernels[0].grid.x;
  for (size_t r = 0; r < (sameGrid ? a.size() : 1); ++r) {
    INFO("result " << r);
    CHECK(std::memcmp(a[r].raw(), b[r].raw(), a[r].bytes()) == 0);
  }
  return sameGrid;
}

// Checks that the new kernels' results gotNew equal the old kernels' gotOld bit for bit where oldBitsExpected
// says so (in: the case's inputs); returns how many results or table rows were compared.
inline int checkOldBits(const Node& n, const std::vector<HostTensor>& in, const std::vector<HostTensor>& gotNew,
                        const std::vector<HostTensor>& gotOld) {
  int same = 0;
  for (size_t r = 0; r < gotNew.size(); ++r) {
    std::vector<bool> rowOk;
    if (!oldBitsExpected(n, r, in, &rowOk)) continue;
    size_t rows = rowOk.empty() ? 1 : rowOk.size(), rowBytes = gotNew[r].bytes() / rows;
    for (size_t v = 0; v < rows; ++v)
      if (rowOk.empty() || rowOk[v]) {
        INFO("result " << r << " row " << v);
        CHECK(std::memcmp(gotNew[r].raw() + v * rowBytes, gotOld[r].raw() + v * rowBytes, rowBytes) == 0);
        ++same;
      }
  }
  return same;
}

// The tensor-core attention kernels' variants other than the shipped one (cuda::TcAttnOptions's defaults,
// which lowerCase takes): each is checked on every case named "tc ..." (plain and packed layouts, causal and
// full, dropout, odd T) as the shipped kernels are, so that a benchmark may pick any of them.
struct TcVariant {
  const char* name;
  cuda::TcAttnOptions opt;
};
inline std::vector<TcVariant> tcAttentionVariants() {
  auto with = [](cuda::TcAttnOptions o, auto&& edit) {
    edit(o);
    return o;
  };
  using O = cuda::TcAttnOptions;
  return {{"narrow (16-row warps, 64-row tiles: the default before wideWarps)", O::narrow()},
          {"split P (P and dS as 16-bit hi + lo parts, two mma each: the default before)",
           with(O{}, [](O& o) { o.splitP = true; })},
          {"main (narrow, sync loads, 32-bit fragment loads)", with(O::narrow(), [](O& o) { o.asyncCopy = o.ldmatrix = false; })},
          {"narrow, cp.async only", with(O::narrow(), [](O& o) { o.ldmatrix = false; })},
          {"narrow, ldmatrix only", with(O::narrow(), [](O& o) { o.asyncCopy = false; })},
          {"wide, sync loads, 32-bit fragment loads", with(O{}, [](O& o) { o.asyncCopy = o.ldmatrix = false, o.wideBackward = true; })},
          {"wide, 64-row walked tiles, unfused scale, eager rescale",
           with(O{}, [](O& o) { o.walkRows = 64, o.fusedScale = o.lazyRescale = false, o.wideBackward = true; })},
          {"wide, 16-row walked tiles", with(O{}, [](O& o) { o.walkRows = 16, o.wideBackward = true; })}};
}
inline bool isTcAttentionCase(const Case& c) { return c.name.find(" tc ") != std::string::npos; }
// The bf16/f16 tolerance of a tensor-core attention case run with options `opt`. With one 16-bit P (splitP off:
// FlashAttention-2's and PyTorch SDPA's numerics, the shipped default) P and dS are rounded to bf16 before
// the P V style products; the gradients then land up to 3.3e-2 off the f32 CPU backend (H200: dk of the
// T 1024 D64 case), where PyTorch's flash kernel lands at 3.8e-2 (D64) and 5.6e-2 (D128) on inputs drawn
// the same way (bench/attention_numerics.py, H200, 2026-12-03): such cases get 4e-2, no looser than the
// kernel users compare against. With splitP they carry ~16 mantissa bits of P and keep 1e-2.
// Any attention case the tensor-core kernels run (16-bit q, k, v with head_dim % 16 == 0, at most 128; the
// first operand's last dim is head_dim in all four ops), whether or not its name says "tc".
inline bool runsTcAttention(const Case& c) {
  const bool att = c.op == OpKind::Attention || c.op == OpKind::AttentionGrad || c.op == OpKind::AttentionQkv ||
                   c.op == OpKind::AttentionQkvGrad;
  if (!att || c.types.empty()) return false;
  const TensorType& t = c.types[0];
  return (t.dtype == DType::bf16 || t.dtype == DType::f16) && t.shape.back() % 16 == 0 && t.shape.back() <= 128;
}
inline double tcAttentionTol(const Case& c, const cuda::TcAttnOptions& opt) {
  return runsTcAttention(c) && !opt.splitP ? 4e-2 : 1e-2;
}
inline Result<NodeLowering> lowerTcVariant(OneOp& o, const cuda::TcAttnOptions& opt) {
  return cuda::isAttentionBackward(*o.node) ? cuda::lowerAttentionGradTensorCore(*o.node, sm90(), opt)
                                            : cuda::lowerAttentionTensorCore(*o.node, sm90(), opt);
}

// Compares every result; returns how many were compared.
inline int compareResults(OneOp& o, const std::vector<HostTensor>& got, const std::vector<HostTensor>& want,
                          double tol16 = 1e-2) {
  REQUIRE(got.size() == want.size());
  int compared = 0;
  for (size_t r = 0; r < got.size(); ++r) {
    DType dt = o.node->result(r)->dtype();
    double tol = dt == DType::f32 ? 1e-5 : tol16;
    std::vector<double> g = values(got[r]), w = values(want[r]);
    double rms = 0;
    for (double v : w) rms += v * v;
    rms = std::sqrt(rms / std::max<size_t>(w.size(), 1));
    double worst = 0;
    size_t at = 0;
    for (size_t i = 0; i < g.size(); ++i) {
      double e = g[i] == w[i] ? 0.0 : std::abs(g[i] - w[i]) / (std::abs(w[i]) + rms + 1e-30);  // equal infinities: 0
      if (!(e <= worst)) {  // NaN counts as the worst
        worst = std::isnan(e) ? INFINITY : e;
        at = i;
      }
    }
    INFO("result " << r << ": worst relative error " << worst << " at " << at << " (got "
                   << (g.empty() ? 0.0 : g[at]) << ", cpu " << (w.empty() ? 0.0 : w[at]) << ")");
    CHECK(worst <= tol);
    ++compared;
  }
  return compared;
}


// A kernel's arguments as cudaLaunchKernel takes them: args[i] points at the i-th value. `hold`: the hold
// word; `place`: where a Table argument's addresses go (a device copy on the GPU; default: host memory);
// `fresh`: the fresh word (cast groups with kept copies).
struct ArgPack {
  std::vector<void*> ptrs, args;
  std::vector<long long> ints;
  std::vector<float> floats;
  std::vector<unsigned long long> seeds;
  std::vector<std::vector<uint64_t>> tables;
  ArgPack(const KernelSpec& k, const std::vector<void*>& ops, const std::vector<void*>& res, char* ws, uint64_t seed,
          void* step, void* hold = nullptr, std::function<void*(const std::vector<uint64_t>&)> place = {},
          void* fresh = nullptr)
      : ptrs(k.args.size()), args(k.args.size()), ints(k.args.size()), floats(k.args.size()), seeds(k.args.size()),
        tables(k.args.size()) {
    for (size_t a = 0; a < k.args.size(); ++a) {
      const cuda::KernelArg& ka = k.args[a];
      switch (ka.kind) {
        case ArgKind::Operand: ptrs[a] = ops[ka.index]; args[a] = &ptrs[a]; break;
        case ArgKind::Result: ptrs[a] = res[ka.index]; args[a] = &ptrs[a]; break;
        case ArgKind::Workspace: ptrs[a] = ws + ka.index; args[a] = &ptrs[a]; break;
        case ArgKind::Int64: ints[a] = ka.i; args[a] = &ints[a]; break;
        case ArgKind::Float: floats[a] = static_cast<float>(ka.f); args[a] = &floats[a]; break;
        case ArgKind::Seed: seeds[a] = seed; args[a] = &seeds[a]; break;
        case ArgKind::StepPtr: ptrs[a] = step; args[a] = &ptrs[a]; break;
        case ArgKind::HoldPtr: ptrs[a] = hold; args[a] = &ptrs[a]; break;
        case ArgKind::FreshPtr: ptrs[a] = fresh; args[a] = &ptrs[a]; break;
        case ArgKind::Table:
          for (const cuda::KernelArg& e : k.tables.at(static_cast<size_t>(ka.index)))
            tables[a].push_back(reinterpret_cast<uint64_t>(e.kind == ArgKind::Operand ? ops.at(e.index) : res.at(e.index)));
          ptrs[a] = place ? place(tables[a]) : tables[a].data();
          args[a] = &ptrs[a];
          break;
        case ArgKind::TensorMap:  // gemm_sm90's kernel runs through the backend (test_matmul_epilogues_gpu.cpp)
          throw std::logic_error("kernel cases: TMA descriptor arguments are bound by the CUDA backend only");
      }
    }
  }
};

}  // namespace tpc::test::kernels
