// Fused elementwise kernels: a fusion group (ir/fusion_group.h) as ONE generated kernel over the group's
// index space. Each member computes what its unfused kernel (elementwise.cpp) computes, from the same
// expressions, and keeps the value in a register rounded to its dtype (codegen::roundTrip), so fusing changes
// no bit; only the group's outputs are stored. Dropout draws Philox at the same global element index.
// Vector path: each thread loads and stores 16 bytes per buffer (8 x bf16, 4 x f32; VEC = 16 / the smallest
// element size) when numel % VEC == 0 and every input is the group's shape, a scalar, or a broadcast of its
// trailing dims whose numel is a multiple of VEC (a bias [N]); otherwise the scalar path with strides.
#include <algorithm>
#include <functional>

#include "runtime/cuda/kernels/codegen.h"
#include "runtime/cuda/kernels/generated_lowerings.h"

namespace tpc::cuda {

using namespace codegen;

namespace {

enum class Access { Direct, Scalar, Trailing, Strided };

// How input v is indexed from the group's element index.
Access accessOf(const Value* v, const Shape& shape) {
  if (v->shape() == shape) return Access::Direct;
  if (v->type().numel() == 1) return Access::Scalar;
  Shape s = v->shape();
  while (!s.empty() && s.front() == 1) s.erase(s.begin());
  if (s.size() <= shape.size() && std::equal(s.begin(), s.end(), shape.end() - static_cast<long>(s.size())))
    return Access::Trailing;
  return Access::Strided;
}

bool needsGlobalIndex(const Node& n) {
  return n.op() == OpKind::Dropout && n.getFloat("p") != 0.0 && !n.getInts("global_shape").empty();
}

}  // namespace

Result<NodeLowering> lowerFusionGroup(const FusionGroup& fg, const LoweringContext&) {
  if (fg.members.empty() || fg.outputs.empty()) return makeError("fusion_group=", fg.id, ": no member or no output");
  const Shape& shape = fg.shape;
  const size_t r = shape.size();
  int64_t numel = 1;
  for (int64_t d : shape) numel *= d;

  // Vector width and whether the vector path applies.
  int minSize = 8;
  for (const Value* v : fg.inputs)
    if (accessOf(v, shape) != Access::Scalar) minSize = std::min(minSize, static_cast<int>(dtypeSize(v->dtype())));
  for (const Value* v : fg.outputs) minSize = std::min(minSize, static_cast<int>(dtypeSize(v->dtype())));
  const int64_t vec = 16 / std::max(minSize, 2);
  bool vectorized = numel % vec == 0 && numel > 0;
  for (const Value* v : fg.inputs) {
    Access a = accessOf(v, shape);
    if (a == Access::Strided || (a == Access::Trailing && v->type().numel() % vec != 0)) vectorized = false;
  }
  bool anyGlobal = false;
  for (const Node* m : fg.members) anyGlobal |= needsGlobalIndex(*m);

  std::string sig, pre, body;
  std::vector<KernelArg> args;
  for (size_t k = 0; k < fg.outputs.size(); ++k) {
    sig += cat(k ? ", " : "", ctype(fg.outputs[k]->dtype()), "* out", k);
    args.push_back({ArgKind::Result, static_cast<int64_t>(k)});
  }
  for (size_t k = 0; k < fg.inputs.size(); ++k) {
    sig += cat(", const ", ctype(fg.inputs[k]->dtype()), "* in", k);
    args.push_back({ArgKind::Operand, static_cast<int64_t>(k)});
  }
  sig += ", i64 n";
  args.push_back({ArgKind::Int64, 0, numel});
  // Per-dim sizes when some index is decomposed (strided inputs on the scalar path, sharded dropout).
  bool anyStrided = false;
  for (const Value* v : fg.inputs) {
    Access a = accessOf(v, shape);
    anyStrided |= a == Access::Strided || (!vectorized && a == Access::Trailing);
  }
  const bool decompose = anyStrided || anyGlobal;
  if (decompose)
    for (size_t d = 0; d < r; ++d) {
      sig += cat(", i64 d", d);
      args.push_back({ArgKind::Int64, 0, shape[d]});
    }
  // Input offsets for element e: direct e, scalar 0, trailing e % m (vector path), else strides.
  std::vector<std::string> offset(fg.inputs.size());
  for (size_t k = 0; k < fg.inputs.size(); ++k) {
    const Value* v = fg.inputs[k];
    Access a = accessOf(v, shape);
    if (a == Access::Direct) offset[k] = "e";
    else if (a == Access::Scalar) offset[k] = "0";
    else if (a == Access::Trailing && vectorized) {
      sig += cat(", i64 m", k);
      args.push_back({ArgKind::Int64, 0, v->type().numel()});
      offset[k] = cat("(e % m", k, ")");
    } else {
      std::vector<int64_t> st = broadcastStrides(v->shape(), shape);
      offset[k] = cat("o", k);
      for (size_t d = 0; d < r; ++d) {
        sig += cat(", i64 s", k, "_", d);
        args.push_back({ArgKind::Int64, 0, st[d]});
      }
    }
  }
  // Member attributes as arguments (sources depend on the group's structure, not on shapes or constants).
  bool random = false;
  for (size_t m = 0; m < fg.members.size(); ++m) {
    const Node& n = *fg.members[m];
    if (n.op() == OpKind::Scale) {
      sig += cat(", float factor", m);
      args.push_back({ArgKind::Float, 0, 0, n.getFloat("factor")});
    }
    if (n.op() == OpKind::Dropout && n.getFloat("p") != 0.0) {
      double p = n.getFloat("p");
      random = true;
      sig += cat(", float p", m, ", float scale", m, ", i64 key", m);
      args.push_back({ArgKind::Float, 0, 0, p});
      args.push_back({ArgKind::Float, 0, 0, static_cast<double>(static_cast<float>(1.0 / (1.0 - p)))});
      args.push_back({ArgKind::Int64, 0, n.getInt("key")});
      if (needsGlobalIndex(n)) {
        const auto& gs = n.getInts("global_shape");
        const auto& off = n.getInts("offsets");
        if (gs.size() != r || off.size() != r)
          return makeError("dropout: global_shape ", shapeStr(gs), " and offsets ", shapeStr(off), " must both have ", r,
                           " entries (x's shape)");
        std::vector<int64_t> gst = strides(gs);
        for (size_t d = 0; d < r; ++d) {
          sig += cat(", i64 go", m, "_", d, ", i64 gs", m, "_", d);
          args.push_back({ArgKind::Int64, 0, off[d]});
          args.push_back({ArgKind::Int64, 0, gst[d]});
        }
      }
    }
  }
  if (random) {
    sig += ", u64 seed, const i64* step";
    args.push_back({ArgKind::Seed});
    args.push_back({ArgKind::StepPtr});
  }

  // The computation of element e, given `ld(k)`, the value of input k.
  auto element = [&](const std::function<std::string(size_t)>& ld, const std::function<std::string(size_t, const std::string&)>& st)
      -> Result<std::string> {
    std::string s;
    if (decompose) {
      s += "      i64 rem = e";
      for (size_t d = 0; d < r; ++d) s += cat(", q", d);
      s += ";\n";
      for (size_t d = r; d-- > 0;) s += cat("      q", d, " = rem % d", d, "; rem /= d", d, ";\n");
    }
    for (size_t k = 0; k < fg.inputs.size(); ++k) {
      if (offset[k] == cat("o", k)) {
        s += cat("      const i64 o", k, " = 0");
        for (size_t d = 0; d < r; ++d) s += cat(" + q", d, " * s", k, "_", d);
        s += ";\n";
      }
      s += cat("      const ", computeType(fg.inputs[k]->dtype()), " x", k, " = ", ld(k), ";\n");
    }
    // Register of each value: inputs x<k>, member results v<m>.
    auto reg = [&](const Value* v) -> std::string {
      for (size_t m = 0; m < fg.members.size(); ++m)
        if (fg.members[m]->result() == v) return cat("v", m);
      for (size_t k = 0; k < fg.inputs.size(); ++k)
        if (fg.inputs[k] == v) return cat("x", k);
      return "<missing>";
    };
    for (size_t m = 0; m < fg.members.size(); ++m) {
      const Node& n = *fg.members[m];
      std::string C = computeType(elementwiseComputeDType(n));
      TPC_ASSIGN(std::string e, elementwiseExpr(n, C));
      bool rnd = n.op() == OpKind::Dropout && n.getFloat("p") != 0.0;
      if (n.op() == OpKind::Dropout && !rnd) e = "x";
      DType rd = n.result()->dtype();
      s += cat("      ", computeType(rd), " v", m, ";\n      {\n");
      const char* names[] = {"x", "y"};
      for (unsigned k = 0; k < n.numOperands(); ++k) s += cat("        const ", C, " ", names[k], " = (", C, ")", reg(n.operand(k)), ";\n");
      if (n.op() == OpKind::Scale) s += cat("        const float factor = factor", m, ";\n");
      if (rnd) {
        s += cat("        const float p = p", m, ", scale = scale", m, ";\n        const i64 key = key", m, ";\n");
        if (needsGlobalIndex(n)) {
          s += "        const i64 g = 0";
          for (size_t d = 0; d < r; ++d) s += cat(" + (go", m, "_", d, " + q", d, ") * gs", m, "_", d);
          s += ";\n";
        } else {
          s += "        const i64 g = e;\n";
        }
      }
      s += cat("        v", m, " = ", roundTrip(rd, e), ";\n      }\n");
    }
    for (size_t k = 0; k < fg.outputs.size(); ++k) s += st(k, reg(fg.outputs[k]));
    return s;
  };

  if (vectorized) {
    // Buffers of VEC elements: 16-byte pieces when VEC elements fill whole pieces, else element copies.
    auto vload = [&](const std::string& dst, DType t, const std::string& src) {
      int64_t bytes = vec * dtypeSize(t);
      if (bytes % 16 == 0)
        return cat("      #pragma unroll\n      for (int w = 0; w < ", bytes / 16, "; ++w) reinterpret_cast<uint4*>(", dst,
                   ")[w] = reinterpret_cast<const uint4*>(", src, ")[w];\n");
      return cat("      #pragma unroll\n      for (int w = 0; w < ", vec, "; ++w) ", dst, "[w] = (", src, ")[w];\n");
    };
    auto vstore = [&](const std::string& dst, DType t, const std::string& src) {
      int64_t bytes = vec * dtypeSize(t);
      if (bytes % 16 == 0)
        return cat("      #pragma unroll\n      for (int w = 0; w < ", bytes / 16, "; ++w) reinterpret_cast<uint4*>(", dst,
                   ")[w] = reinterpret_cast<const uint4*>(", src, ")[w];\n");
      return cat("      #pragma unroll\n      for (int w = 0; w < ", vec, "; ++w) (", dst, ")[w] = ", src, "[w];\n");
    };
    std::string loop = cat("  for (i64 t = blockIdx.x * (i64)blockDim.x + threadIdx.x; t < n / ", vec,
                           "; t += (i64)gridDim.x * blockDim.x) {\n    const i64 i0 = t * ", vec, ";\n");
    for (size_t k = 0; k < fg.inputs.size(); ++k) {
      if (accessOf(fg.inputs[k], shape) == Access::Scalar) continue;
      std::string T = ctype(fg.inputs[k]->dtype());
      std::string base = offset[k] == "e" ? "i0" : cat("(i0 % m", k, ")");
      loop += cat("    __align__(16) ", T, " a", k, "[", vec, "];\n");
      loop += "    {\n" + vload(cat("a", k), fg.inputs[k]->dtype(), cat("in", k, " + ", base)) + "    }\n";
    }
    for (size_t k = 0; k < fg.outputs.size(); ++k)
      loop += cat("    __align__(16) ", ctype(fg.outputs[k]->dtype()), " b", k, "[", vec, "];\n");
    auto ld = [&](size_t k) {
      if (accessOf(fg.inputs[k], shape) == Access::Scalar) return load(fg.inputs[k]->dtype(), cat("in", k));
      return load(fg.inputs[k]->dtype(), cat("a", k, " + j"));
    };
    auto st = [&](size_t k, const std::string& v) { return "      " + store(fg.outputs[k]->dtype(), cat("b", k, " + j"), v) + "\n"; };
    TPC_ASSIGN(std::string el, element(ld, st));
    loop += cat("    #pragma unroll\n    for (int j = 0; j < ", vec, "; ++j) {\n      const i64 e = i0 + j;\n", el, "    }\n");
    for (size_t k = 0; k < fg.outputs.size(); ++k)
      loop += "    {\n" + vstore(cat("out", k, " + i0"), fg.outputs[k]->dtype(), cat("b", k)) + "    }\n";
    body = loop + "  }\n";
  } else {
    auto ld = [&](size_t k) { return load(fg.inputs[k]->dtype(), cat("in", k, " + ", offset[k])); };
    auto st = [&](size_t k, const std::string& v) { return "      " + store(fg.outputs[k]->dtype(), cat("out", k, " + e"), v) + "\n"; };
    TPC_ASSIGN(std::string el, element(ld, st));
    body = "  for (i64 e = blockIdx.x * (i64)blockDim.x + threadIdx.x; e < n; e += (i64)gridDim.x * blockDim.x) {\n" + el + "  }\n";
  }
  bool gelu = std::any_of(fg.members.begin(), fg.members.end(), [](const Node* m) { return m->op() == OpKind::GeluGrad; });
  std::string helpers = gelu ? geluDerivativeSource() : "";
  std::string text = "(" + sig + ") {\n" + body + "}\n";
  KernelSpec k;
  k.entry = entryName(vectorized ? "tpc_fused_v" : "tpc_fused", helpers + text);
  k.source = withPrelude(helpers + "extern \"C\" __global__ void " + k.entry + text);
  elementwiseGeometry(k, vectorized ? numel / vec : numel);
  k.args = std::move(args);
  NodeLowering l;
  l.kernels.push_back(std::move(k));
  return l;
}

}  // namespace tpc::cuda
