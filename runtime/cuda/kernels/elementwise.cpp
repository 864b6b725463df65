// Generated elementwise kernels: unary math, scale, cast, dropout (Philox keyed by the global element
// index, as runtime/cpu/elementwise.cpp), gelu (tanh) and its gradient, and the binary ops with numpy
// broadcasting. One kernel per node; shapes and strides are kernel arguments, so a source depends only on
// (op, dtypes, rank, which operands are contiguous) and is compiled once for all shapes.
#include "runtime/cuda/kernels/codegen.h"
#include "runtime/cuda/kernels/generated_lowerings.h"

namespace tpc::cuda {

using namespace codegen;

// The expression of op `n` on x (and y) in compute type C.
Result<std::string> elementwiseExpr(const Node& n, const std::string& C) {
  bool d = C == "double";
  auto fn = [&](const char* name) { return std::string(name) + (d ? "" : "f") + "(x)"; };
  switch (n.op()) {
    case OpKind::Neg: return std::string("-x");
    case OpKind::Exp: return fn("exp");
    case OpKind::Log: return fn("log");
    case OpKind::Sqrt: return fn("sqrt");
    case OpKind::Rsqrt: return std::string(d ? "1.0 / sqrt(x)" : "1.0f / sqrtf(x)");
    case OpKind::Tanh: return fn("tanh");
    case OpKind::Gelu:
      return d ? std::string("0.5 * x * (1.0 + tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)))")
               : std::string("0.5f * x * (1.0f + tanhf(0.7978845608028654f * (x + 0.044715f * x * x * x)))");
    case OpKind::Scale: return std::string("x * (") + C + ")factor";
    case OpKind::Cast: return std::string("x");
    case OpKind::Dropout: return std::string("(tpc_dropout_keep(seed, *step, (u32)key, (u64)g, p) ? x * (") + C + ")scale : (" + C + ")0)";
    case OpKind::Add: return std::string("x + y");
    case OpKind::Sub: return std::string("x - y");
    case OpKind::Mul: return std::string("x * y");
    case OpKind::Div: return std::string("x / y");
    case OpKind::GeluGrad:  // (dy, x): x here is dy, y is the gelu input
      return d ? std::string("x * (0.5 * (1.0 + tanh(0.7978845608028654 * (y + 0.044715 * y * y * y))) + 0.5 * y * (1.0 - "
                             "tanh(0.7978845608028654 * (y + 0.044715 * y * y * y)) * tanh(0.7978845608028654 * (y + "
                             "0.044715 * y * y * y))) * 0.7978845608028654 * (1.0 + 0.134145 * y * y))")
               : std::string("x * gelu_d(y)");
    default: return makeError("cuda: ", n.opName(), " is not an elementwise op of the generated lowerings");
  }
}

namespace {

const char* kGeluDerivative = R"CUDA(
__device__ __forceinline__ float gelu_d(float v) {
  float t = tanhf(0.7978845608028654f * (v + 0.044715f * v * v * v));
  return 0.5f * (1.0f + t) + 0.5f * v * (1.0f - t * t) * 0.7978845608028654f * (1.0f + 0.134145f * v * v);
}
)CUDA";

}  // namespace

const char* geluDerivativeSource() { return kGeluDerivative; }

DType elementwiseComputeDType(const Node& n) {
  // Compute in the widest type involved (cast: the input's domain, converted on store).
  DType od = n.result()->dtype(), cd = od;
  for (Value* v : n.operands())
    if (v->dtype() == DType::f64 || (isFloat(v->dtype()) && !isFloat(cd) && n.op() != OpKind::Cast)) cd = v->dtype();
  if (n.op() == OpKind::Cast) cd = n.operand(0)->dtype() == DType::f64 || od == DType::f64 ? DType::f64 : n.operand(0)->dtype();
  return cd;
}

Result<NodeLowering> lowerElementwise(const Node& n, const LoweringContext&) {
  const Value* out = n.result();
  const Shape& os = out->shape();
  size_t r = os.size();
  int64_t numel = out->type().numel();
  DType od = out->dtype();
  bool random = n.op() == OpKind::Dropout && n.getFloat("p") != 0.0;
  std::string C = computeType(elementwiseComputeDType(n));
  TPC_ASSIGN(std::string e, elementwiseExpr(n, C));
  if (n.op() == OpKind::Dropout && !random) e = "x";

  // Signature and per-operand offsets: a contiguous operand of the output's size is indexed by i directly.
  std::string sig = ctype(od) + "* out", idx, loads;
  std::vector<KernelArg> args = {{ArgKind::Result, 0}};
  std::vector<std::vector<int64_t>> opStrides;
  std::vector<bool> direct;
  const char* names[] = {"x", "y"};
  for (unsigned k = 0; k < n.numOperands(); ++k) {
    const Value* v = n.operand(k);
    sig += ", const " + ctype(v->dtype()) + "* in" + std::to_string(k);
    args.push_back({ArgKind::Operand, k});
    direct.push_back(v->shape() == os);
    opStrides.push_back(broadcastStrides(v->shape(), os));
  }
  sig += ", i64 n";
  args.push_back({ArgKind::Int64, 0, numel});
  bool needIndex = random && !n.getInts("global_shape").empty();
  for (unsigned k = 0; k < n.numOperands(); ++k) needIndex |= !direct[k];
  if (needIndex) {
    for (size_t d = 0; d < r; ++d) {
      sig += ", i64 d" + std::to_string(d);
      args.push_back({ArgKind::Int64, 0, os[d]});
    }
    for (unsigned k = 0; k < n.numOperands(); ++k) {
      if (direct[k]) continue;
      for (size_t d = 0; d < r; ++d) {
        sig += cat(", i64 s", k, "_", d);
        args.push_back({ArgKind::Int64, 0, opStrides[k][d]});
      }
    }
  }
  if (n.op() == OpKind::Scale) {
    sig += ", float factor";
    args.push_back({ArgKind::Float, 0, 0, n.getFloat("factor")});
  }
  std::string gexpr = "i";
  if (random) {
    double p = n.getFloat("p");
    sig += ", float p, float scale, i64 key, u64 seed, const i64* step";
    args.push_back({ArgKind::Float, 0, 0, p});
    args.push_back({ArgKind::Float, 0, 0, static_cast<double>(static_cast<float>(1.0 / (1.0 - p)))});
    args.push_back({ArgKind::Int64, 0, n.getInt("key")});
    args.push_back({ArgKind::Seed});
    args.push_back({ArgKind::StepPtr});
    const auto& gs = n.getInts("global_shape");
    const auto& off = n.getInts("offsets");
    if (!gs.empty()) {
      if (gs.size() != r || off.size() != r)
        return makeError("dropout: global_shape ", shapeStr(gs), " and offsets ", shapeStr(off), " must both have ", r,
                         " entries (x's shape)");
      std::vector<int64_t> gst = strides(gs);
      gexpr = "g";
      for (size_t d = 0; d < r; ++d) {
        sig += cat(", i64 go", d, ", i64 gs", d);
        args.push_back({ArgKind::Int64, 0, off[d]});
        args.push_back({ArgKind::Int64, 0, gst[d]});
      }
    }
  }

  if (needIndex) {
    idx = "    i64 rem = i";
    for (unsigned k = 0; k < n.numOperands(); ++k)
      if (!direct[k]) idx += cat(", o", k, " = 0");
    if (gexpr == "g") idx += ", g = 0";
    idx += ";\n";
    for (size_t d = r; d-- > 0;) {
      idx += cat("    { i64 q = rem % d", d, "; rem /= d", d, ";");
      for (unsigned k = 0; k < n.numOperands(); ++k)
        if (!direct[k]) idx += cat(" o", k, " += q * s", k, "_", d, ";");
      if (gexpr == "g") idx += cat(" g += (go", d, " + q) * gs", d, ";");
      idx += " }\n";
    }
  }
  if (random && gexpr == "i") idx += "    i64 g = i;\n";
  for (unsigned k = 0; k < n.numOperands(); ++k) {
    std::string ptr = cat("in", k, " + ", direct[k] ? std::string("i") : cat("o", k));
    std::string v = load(n.operand(k)->dtype(), ptr);
    // A float operand read in an integer op or vice versa converts explicitly.
    loads += cat("    ", C, " ", names[k], " = (", C, ")", v, ";\n");
  }
  std::string body = "(" + sig + ") {\n  for (i64 i = blockIdx.x * (i64)blockDim.x + threadIdx.x; i < n; i += (i64)gridDim.x * blockDim.x) {\n" +
                     idx + loads + "    " + store(od, "out + i", e) + "\n  }\n}\n";
  KernelSpec k;
  std::string helpers = n.op() == OpKind::GeluGrad ? kGeluDerivative : "";
  k.entry = entryName(cat("tpc_", n.opName()), helpers + body);
  k.source = withPrelude(helpers + "extern \"C\" __global__ void " + k.entry + body);
  elementwiseGeometry(k, numel);
  k.args = std::move(args);
  NodeLowering l;
  l.kernels.push_back(std::move(k));
  return l;
}

}  // namespace tpc::cuda
