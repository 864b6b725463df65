// cuDNN fused attention through the backend descriptors: a small builder (tensors, matmul, pointwise and
// reduction operations), the forward and backward operation graphs, heuristics to an execution plan, and
// variant packs. The graphs follow the cudnn-frontend's SDPA nodes (include/cudnn_frontend/node/
// scaled_dot_product_flash_attention.h), which is the pattern cuDNN's fused attention engines recognise.
#include "runtime/cuda/cudnn_attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <set>

#include "runtime/cuda/candidate_timing.h"
#include "runtime/cuda/cuda_libraries.h"
#include "runtime/cuda/disk_cache.h"
#include "runtime/cuda/kernels/kernel_source.h"

namespace tpc::cuda {

bool cudnnAttentionEligible(const AttnShape& a) {
  if (a.dt != DType::bf16 && a.dt != DType::f16) return false;
  if (a.D % 8 != 0 || a.D > 128 || a.Tq != a.Tk || a.dropout > 0) return false;
  // 16-byte aligned rows: every stride and offset a multiple of 8 elements (those a forward lacks are 0).
  for (const AttnRows* r : {&a.q, &a.k, &a.v, &a.o, &a.dout, &a.dq, &a.dk, &a.dv})
    if (r->off % 8 || r->sb % 8 || r->sh % 8 || r->st % 8) return false;
  return true;
}

bool cudnnAttentionTakes(const Node& n) {
  OpKind k = n.op();
  if (k != OpKind::Attention && k != OpKind::AttentionGrad && k != OpKind::AttentionQkv && k != OpKind::AttentionQkvGrad)
    return false;
  auto a = attnShape(n);
  // cuDNN up to 9.15 runs a backward whose T is not a multiple of 128 only with a padding mask and
  // sequence-length tensors in the graph (the frontend's workaround, not built here); ours take those
  // backwards whatever the cuDNN version.
  return a.ok() && cudnnAttentionEligible(*a) && (!isAttentionBackward(n) || a->Tq % 128 == 0);
}

namespace {

// Tensor UIDs of the node's real tensors (the variant pack binds these); virtual ones count up from kFirstVirtual.
enum Uid : int64_t { kQ = 1, kK, kV, kO, kStats, kScale, kDO, kDQ, kDK, kDV, kNegInf, kOne, kSoftmaxSum, kDQAccum, kFirstVirtual = 100 };

std::string cudnnError(const Cudnn& lib, cudnnStatus_t s) {
  char last[1024] = {0};
  lib.getLastErrorString(last, sizeof last);
  return cat(lib.getErrorString(s), last[0] ? cat(" (", last, ")") : std::string());
}

#define CUDNN_TRY(call, ...)                                                              \
  do {                                                                                    \
    cudnnStatus_t s_ = (call);                                                            \
    if (s_ != CUDNN_STATUS_SUCCESS) return makeError("cuDNN: ", __VA_ARGS__, ": ", cudnnError(*lib_, s_)); \
  } while (0)

// One backend descriptor, destroyed with its owner.
class Desc {
 public:
  Desc() = default;
  Desc(const Cudnn* lib, cudnnBackendDescriptor_t d) : lib_(lib), d_(d) {}
  Desc(Desc&& o) noexcept : lib_(o.lib_), d_(o.d_) { o.d_ = nullptr; }
  Desc& operator=(Desc&& o) noexcept {
    std::swap(lib_, o.lib_);
    std::swap(d_, o.d_);
    return *this;
  }
  ~Desc() {
    if (d_) lib_->destroyDescriptor(d_);
  }
  cudnnBackendDescriptor_t get() const { return d_; }

 private:
  const Cudnn* lib_ = nullptr;
  cudnnBackendDescriptor_t d_ = nullptr;
};

// A tensor of the graph being built: its descriptor, UID and dims.
struct Tensor {
  cudnnBackendDescriptor_t d = nullptr;
  int64_t uid = 0;
  std::vector<int64_t> dims;
};

// Builds one operation graph; every descriptor it creates lives as long as the builder (or the plan that takes them).
class GraphBuilder {
 public:
  GraphBuilder(const Cudnn* lib, bool deterministic = false)
      : lib_(lib), version_(static_cast<int64_t>(lib->getVersion())), deterministic_(deterministic) {}
  bool deterministic() const { return deterministic_; }

  Result<Desc> create(cudnnBackendDescriptorType_t type, const char* what) {
    cudnnBackendDescriptor_t d = nullptr;
    CUDNN_TRY(lib_->createDescriptor(type, &d), "creating a ", what, " descriptor");
    return Desc(lib_, d);
  }
  Status set(cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type,
             int64_t count, const void* values, const char* what) {
    CUDNN_TRY(lib_->setAttribute(d, name, type, count, values), "setting attribute ", static_cast<int>(name), " of ", what);
    return {};
  }
  Status finalize(cudnnBackendDescriptor_t d, const char* what) {
    CUDNN_TRY(lib_->finalize(d), "finalizing ", what);
    return {};
  }

  // A real tensor (uid given) or a virtual one (uid 0: the next free one).
  Result<Tensor> tensor(int64_t uid, std::vector<int64_t> dims, std::vector<int64_t> strides, cudnnDataType_t dt,
                        bool isVirtual = false, bool byValue = false) {
    TPC_ASSIGN(Desc d, create(CUDNN_BACKEND_TENSOR_DESCRIPTOR, "tensor"));
    Tensor t;
    t.d = d.get();
    t.uid = uid ? uid : nextVirtual_++;
    t.dims = std::move(dims);
    int64_t align = 16, n = static_cast<int64_t>(t.dims.size());
    TPC_TRY(set(t.d, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &dt, "a tensor"));
    TPC_TRY(set(t.d, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, n, t.dims.data(), "a tensor"));
    TPC_TRY(set(t.d, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, n, strides.data(), "a tensor"));
    TPC_TRY(set(t.d, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &t.uid, "a tensor"));
    TPC_TRY(set(t.d, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &align, "a tensor"));
    if (isVirtual) TPC_TRY(set(t.d, CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &isVirtual, "a tensor"));
    if (byValue) TPC_TRY(set(t.d, CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &byValue, "a tensor"));
    TPC_TRY(finalize(t.d, "a tensor"));
    keep_.push_back(std::move(d));
    return t;
  }
  // A virtual tensor of these dims, packed.
  Result<Tensor> virt(const std::vector<int64_t>& dims, cudnnDataType_t dt = CUDNN_DATA_FLOAT) {
    std::vector<int64_t> strides(dims.size(), 1);
    for (int i = static_cast<int>(dims.size()) - 2; i >= 0; --i) strides[i] = strides[i + 1] * dims[i + 1];
    return tensor(0, dims, strides, dt, true);
  }

  // Finalizes operation `op` and appends it to the graph; `op` and the descriptor it points to (`config`: a
  // matmul, pointwise or reduction descriptor) live as long as the builder.
  Status addOperation(Desc op, const char* what, Desc config = {}) {
    TPC_TRY(finalize(op.get(), what));
    ops_.push_back(op.get());
    if (config.get()) keep_.push_back(std::move(config));
    keep_.push_back(std::move(op));
    return {};
  }

  Status matmul(const Tensor& a, const Tensor& b, const Tensor& c) {
    TPC_ASSIGN(Desc m, create(CUDNN_BACKEND_MATMUL_DESCRIPTOR, "matmul"));
    cudnnDataType_t comp = CUDNN_DATA_FLOAT;
    TPC_TRY(set(m.get(), CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &comp, "a matmul"));
    TPC_TRY(finalize(m.get(), "a matmul"));
    TPC_ASSIGN(Desc op, create(CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR, "matmul operation"));
    cudnnBackendDescriptor_t md = m.get();
    TPC_TRY(set(op.get(), CUDNN_ATTR_OPERATION_MATMUL_ADESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &a.d, "a matmul operation"));
    TPC_TRY(set(op.get(), CUDNN_ATTR_OPERATION_MATMUL_BDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &b.d, "a matmul operation"));
    TPC_TRY(set(op.get(), CUDNN_ATTR_OPERATION_MATMUL_CDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &c.d, "a matmul operation"));
    TPC_TRY(set(op.get(), CUDNN_ATTR_OPERATION_MATMUL_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &md, "a matmul operation"));
    return addOperation(std::move(op), "a matmul operation", std::move(m));
  }

  // y = mode(x[, b][, t]); axis >= 0 for GEN_INDEX.
  Status pointwise(cudnnPointwiseMode_t mode, const Tensor& x, const Tensor* b, const Tensor& y, const Tensor* t = nullptr,
                   int64_t axis = -1, cudnnDataType_t prec = CUDNN_DATA_FLOAT) {
    TPC_ASSIGN(Desc pw, create(CUDNN_BACKEND_POINTWISE_DESCRIPTOR, "pointwise"));
    TPC_TRY(set(pw.get(), CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode, "a pointwise"));
    TPC_TRY(set(pw.get(), CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &prec, "a pointwise"));
    if (axis >= 0) TPC_TRY(set(pw.get(), CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, 1, &axis, "a pointwise"));
    TPC_TRY(finalize(pw.get(), "a pointwise"));
    TPC_ASSIGN(Desc op, create(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR, "pointwise operation"));
    cudnnBackendDescriptor_t pd = pw.get();
    const char* what = "a pointwise operation";
    TPC_TRY(set(op.get(), CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &pd, what));
    TPC_TRY(set(op.get(), CUDNN_ATTR_OPERATION_POINTWISE_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x.d, what));
    if (b) TPC_TRY(set(op.get(), CUDNN_ATTR_OPERATION_POINTWISE_BDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &b->d, what));
    TPC_TRY(set(op.get(), CUDNN_ATTR_OPERATION_POINTWISE_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y.d, what));
    if (t) TPC_TRY(set(op.get(), CUDNN_ATTR_OPERATION_POINTWISE_TDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &t->d, what));
    float one = 1.f;
    TPC_TRY(set(op.get(), CUDNN_ATTR_OPERATION_POINTWISE_ALPHA1, CUDNN_TYPE_FLOAT, 1, &one, what));
    TPC_TRY(set(op.get(), CUDNN_ATTR_OPERATION_POINTWISE_ALPHA2, CUDNN_TYPE_FLOAT, 1, &one, what));
    return addOperation(std::move(op), what, std::move(pw));
  }

  Status reduction(cudnnReduceTensorOp_t mode, const Tensor& x, const Tensor& y) {
    TPC_ASSIGN(Desc r, create(CUDNN_BACKEND_REDUCTION_DESCRIPTOR, "reduction"));
    cudnnDataType_t comp = CUDNN_DATA_FLOAT;
    TPC_TRY(set(r.get(), CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &mode, "a reduction"));
    TPC_TRY(set(r.get(), CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &comp, "a reduction"));
    if (version_ >= 91100) {  // as the frontend sets it from 9.11 on
      bool deterministic = deterministic_;
      TPC_TRY(set(r.get(), CUDNN_ATTR_REDUCTION_IS_DETERMINISTIC, CUDNN_TYPE_BOOLEAN, 1, &deterministic, "a reduction"));
    }
    TPC_TRY(finalize(r.get(), "a reduction"));
    TPC_ASSIGN(Desc op, create(CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR, "reduction operation"));
    cudnnBackendDescriptor_t rd = r.get();
    const char* what = "a reduction operation";
    TPC_TRY(set(op.get(), CUDNN_ATTR_OPERATION_REDUCTION_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x.d, what));
    TPC_TRY(set(op.get(), CUDNN_ATTR_OPERATION_REDUCTION_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y.d, what));
    TPC_TRY(set(op.get(), CUDNN_ATTR_OPERATION_REDUCTION_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &rd, what));
    return addOperation(std::move(op), what, std::move(r));
  }

  // y = x viewed with y's strides (the backward's transposes of P, dS and K^T).
  Status reshape(const Tensor& x, const Tensor& y) {
    TPC_ASSIGN(Desc op, create(CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR, "reshape operation"));
    const char* what = "a reshape operation";
    TPC_TRY(set(op.get(), CUDNN_ATTR_OPERATION_RESHAPE_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x.d, what));
    TPC_TRY(set(op.get(), CUDNN_ATTR_OPERATION_RESHAPE_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y.d, what));
    return addOperation(std::move(op), what);
  }

  // The same operations into a new virtual tensor (packed, f32 unless `dt`): mode(x[, b]) shaped like x; a
  // reduction over the last dim; a b.
  Result<Tensor> apply(cudnnPointwiseMode_t mode, const Tensor& x, const Tensor* b = nullptr,
                       cudnnDataType_t dt = CUDNN_DATA_FLOAT) {
    TPC_ASSIGN(Tensor y, virt(x.dims, dt));
    TPC_TRY(pointwise(mode, x, b, y));
    return y;
  }
  Result<Tensor> reduce(cudnnReduceTensorOp_t mode, const Tensor& x) {
    std::vector<int64_t> dims = x.dims;
    dims.back() = 1;
    TPC_ASSIGN(Tensor y, virt(dims));
    TPC_TRY(reduction(mode, x, y));
    return y;
  }
  Result<Tensor> product(const Tensor& a, const Tensor& b) {
    TPC_ASSIGN(Tensor c, virt({a.dims[0], a.dims[1], a.dims[2], b.dims[3]}));
    TPC_TRY(matmul(a, b, c));
    return c;
  }

  const std::vector<cudnnBackendDescriptor_t>& ops() const { return ops_; }
  std::vector<Desc> take() { return std::move(keep_); }

 private:
  const Cudnn* lib_;
  int64_t version_;
  bool deterministic_;
  int64_t nextVirtual_ = kFirstVirtual;
  std::vector<Desc> keep_;
  std::vector<cudnnBackendDescriptor_t> ops_;
};


// "engine 2, knobs 24=7": an engine config's engine and knob choices, to tell the heuristics' configs apart
// and to find a remembered one again.
std::string describeConfig(const Cudnn& lib, cudnnBackendDescriptor_t cfg) {
  std::string out = "engine ?";
  int64_t n = 0;
  cudnnBackendDescriptor_t engine = nullptr;
  if (lib.createDescriptor(CUDNN_BACKEND_ENGINE_DESCRIPTOR, &engine) == CUDNN_STATUS_SUCCESS) {
    int64_t index = -1;
    if (lib.getAttribute(cfg, CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &n, &engine) == CUDNN_STATUS_SUCCESS &&
        lib.getAttribute(engine, CUDNN_ATTR_ENGINE_GLOBAL_INDEX, CUDNN_TYPE_INT64, 1, &n, &index) == CUDNN_STATUS_SUCCESS)
      out = cat("engine ", index);
    lib.destroyDescriptor(engine);
  }
  constexpr int kMaxKnobs = 32;
  std::vector<cudnnBackendDescriptor_t> knobs(kMaxKnobs, nullptr);
  int64_t made = 0;
  while (made < kMaxKnobs && lib.createDescriptor(CUDNN_BACKEND_KNOB_CHOICE_DESCRIPTOR, &knobs[made]) == CUDNN_STATUS_SUCCESS) ++made;
  if (lib.getAttribute(cfg, CUDNN_ATTR_ENGINECFG_KNOB_CHOICES, CUDNN_TYPE_BACKEND_DESCRIPTOR, made, &n, knobs.data()) ==
          CUDNN_STATUS_SUCCESS && n > 0) {
    out += ", knobs";
    for (int64_t i = 0; i < std::min(n, made); ++i) {
      cudnnBackendKnobType_t type{};
      int64_t value = 0, m = 0;
      lib.getAttribute(knobs[i], CUDNN_ATTR_KNOB_CHOICE_KNOB_TYPE, CUDNN_TYPE_KNOB_TYPE, 1, &m, &type);
      lib.getAttribute(knobs[i], CUDNN_ATTR_KNOB_CHOICE_KNOB_VALUE, CUDNN_TYPE_INT64, 1, &m, &value);
      out += cat(" ", static_cast<int>(type), "=", value);
    }
  }
  for (int64_t i = 0; i < made; ++i) lib.destroyDescriptor(knobs[i]);
  return out;
}

cudnnDataType_t cudnnType(DType t) { return t == DType::f16 ? CUDNN_DATA_HALF : CUDNN_DATA_BFLOAT16; }

}  // namespace

// One finalized execution plan and what binding it needs: where each real UID's address comes from.
struct CudnnAttention::Plan {
  std::vector<Desc> descriptors;  // the graph's (kept alive with the plan)
  Desc graph, config, plan;
  std::string engine;             // describeConfig of `config`
  int64_t workspace = 0;          // the plan's, after the frontend-style intermediates below
  int64_t intermediates = 0;      // f32 tensors of ours in the workspace (the backward's softmax sum; dQ's
                                  // f32 accumulator ahead of it in the non-deterministic graph)
  struct Source {
    int64_t uid;
    KernelArg arg;     // Operand/Result index of the node, or Workspace (byte offset)
    int64_t elemOff;   // elements past the argument's address
    int elemBytes;
    const float* host = nullptr;  // a by-value scalar: its host address instead
  };
  std::vector<Source> sources;
  float scale = 1.f, negInf = -INFINITY, one = 1.f;  // the by-value scalars (host addresses in the variant pack)
  std::string what;
  double flops = 0;
  // While planning: the distinct configs of the heuristics that finalized, for timing (plan() keeps one).
  struct Candidate {
    Desc config, plan;
    std::string engine;
    int64_t workspace = 0;
  };
  std::vector<Candidate> candidates;
};

struct CudnnAttention::Binding {
  const Plan* plan;
  Desc pack;
  std::vector<int64_t> uids;
  std::vector<void*> pointers;
};

namespace {

using Plan = CudnnAttention::Plan;

Status buildForward(GraphBuilder& g, const AttnShape& a, Plan& p);
Status buildBackward(GraphBuilder& g, const AttnShape& a, Plan& p);
// The variant pack of `p` over the node's operand and result addresses and its workspace (the binding keeps
// the uids and pointers alive with it).
Status makePack(const Cudnn* lib_, const Plan& p, const std::vector<void*>& operands, const std::vector<void*>& results,
                void* workspace, CudnnAttention::Binding& b) {
  b.plan = &p;
  for (const Plan::Source& s : p.sources) {
    char* base = nullptr;
    if (s.host) base = reinterpret_cast<char*>(const_cast<float*>(s.host));
    else if (s.arg.kind == ArgKind::Workspace) base = static_cast<char*>(workspace) + s.arg.index;
    else {
      const bool op = s.arg.kind == ArgKind::Operand;
      const std::vector<void*>& from = op ? operands : results;
      if (s.arg.index < 0 || s.arg.index >= static_cast<int64_t>(from.size()))
        return makeError(p.what, ": ", op ? "operand " : "result ", s.arg.index, " missing (", from.size(), " given)");
      base = static_cast<char*>(from[s.arg.index]);
    }
    b.uids.push_back(s.uid);
    b.pointers.push_back(base + s.elemOff * s.elemBytes);
  }
  GraphBuilder g(lib_);
  TPC_ASSIGN(b.pack, g.create(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, "variant pack"));
  void* planWorkspace = p.workspace ? static_cast<char*>(workspace) + p.intermediates : nullptr;
  int64_t n = static_cast<int64_t>(b.uids.size());
  TPC_TRY(g.set(b.pack.get(), CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, n, b.uids.data(), "a variant pack"));
  TPC_TRY(g.set(b.pack.get(), CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, n, b.pointers.data(),
                "a variant pack"));
  TPC_TRY(g.set(b.pack.get(), CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &planWorkspace, "a variant pack"));
  TPC_TRY(g.finalize(b.pack.get(), "a variant pack"));
  return {};
}

}  // namespace

Result<size_t> CudnnAttention::fastestCandidate(const Node& n, Plan& p) const {
  TPC_ASSIGN(const Cudnn* lib_, cudnn());
  // Scratch for the node's operands and results and the workspace (at least 256 bytes each: no null address).
  DeviceScratch scratch(timing_);
  auto get = [&](int64_t bytes) { return scratch.get(static_cast<size_t>(std::max<int64_t>(bytes, 256))); };
  std::vector<void*> operands, results;
  for (const Value* v : n.operands()) operands.push_back(get(v->type().bytes()));
  for (const Value* v : n.results()) results.push_back(get(v->type().bytes()));
  void* ws = get(p.intermediates + p.workspace);
  if (!scratch.ok()) return size_t{0};  // no memory to time in: the heuristics' first
  Binding b;
  TPC_TRY(makePack(lib_, p, operands, results, ws, b));
  auto h = static_cast<cudnnHandle_t>(handle_);
  CUDNN_TRY(lib_->setStream(h, nullptr), "setting the stream");
  return cuda::fastestCandidate(
      p.candidates.size(),
      [&](size_t i) { return lib_->execute(h, p.candidates[i].plan.get(), b.pack.get()) == CUDNN_STATUS_SUCCESS; },
      timing_);
}

Result<std::unique_ptr<CudnnAttention>> CudnnAttention::create(bool deterministic, bool autotune, CandidateTiming timing) {
  TPC_ASSIGN(const Cudnn* lib, cudnn());
  std::unique_ptr<CudnnAttention> c(new CudnnAttention());
  c->deterministic_ = deterministic;
  c->autotune_ = autotune;
  c->timing_ = timing;
  cudnnHandle_t h = nullptr;
  if (cudnnStatus_t s = lib->create(&h); s != CUDNN_STATUS_SUCCESS)
    return makeError("cuDNN: creating a handle: ", cudnnError(*lib, s));
  c->handle_ = h;
  return c;
}

CudnnAttention::~CudnnAttention() {
  bindings_.clear();
  plans_.clear();
  if (handle_)
    if (auto lib = cudnn(); lib.ok()) (*lib)->destroy(static_cast<cudnnHandle_t>(handle_));
}

std::string CudnnAttention::version() const {
  auto lib = cudnn();
  if (!lib.ok()) return "cuDNN (not loaded)";
  size_t v = (*lib)->getVersion();
  return cat("cuDNN ", v / 10000, ".", v / 100 % 100, ".", v % 100);
}

Result<int> CudnnAttention::plan(const Node& n) {
  TPC_ASSIGN(AttnShape a, attnShape(n));
  if (!cudnnAttentionEligible(a)) return makeError(n.opName(), ": not a shape cuDNN's fused attention takes here");
  const bool bwd = isAttentionBackward(n);
  // One plan per distinct op, shape, layout and scale (a model's layers share theirs).
  std::string key = cat(n.opName(), " ", dtypeName(a.dt), " ", a.B, ",", a.H, ",", a.Tq, ",", a.D, a.causal ? " causal " : " full ",
                        floatLit(a.scale));
  for (const AttnRows* r : {&a.q, &a.k, &a.v, &a.o, &a.dout, &a.dq, &a.dk, &a.dv})
    key += cat(" ", static_cast<int>(r->arg.kind), ":", r->arg.index, "+", r->off, "/", r->sb, ",", r->sh, ",", r->st);
  key += cat(" lse ", static_cast<int>(a.lse.kind), ":", a.lse.index);
  if (auto it = planOf_.find(key); it != planOf_.end()) return it->second;
  if (auto it = failed_.find(key); it != failed_.end()) return makeError(it->second);
  // The engine config timed fastest for this key on this GPU and cuDNN, in this process or an earlier one.
  std::string fullKey, remembered;
  bool known = false;
  if (autotune_) {
    fullKey = cat(currentGpuKey(), " ", version(), deterministic_ ? " deterministic | " : " | ", key, candidateTimingKey(timing_));
    known = readRememberedChoice(fullKey, "cudnn-engine", &remembered);
  }
  auto built = build(a, bwd, known ? &remembered : nullptr);
  if (!built.ok()) {
    failed_[key] = built.error();
    return Error{built.error()};
  }
  Plan& p = **built;
  size_t chosen = 0;
  if (p.candidates.size() > 1) {
    auto fastest = fastestCandidate(n, p);  // timing that cannot run leaves the heuristics' first
    chosen = fastest.ok() ? *fastest : 0;
    timed_ += static_cast<int>(p.candidates.size());
  }
  Plan::Candidate& c = p.candidates[chosen];
  p.config = std::move(c.config);
  p.plan = std::move(c.plan);
  p.engine = std::move(c.engine);
  p.workspace = c.workspace;
  p.candidates.clear();
  if (autotune_) rememberChoice(fullKey, "cudnn-engine", p.engine);
  plans_.push_back(std::move(built).value());
  planOf_[key] = static_cast<int>(plans_.size() - 1);
  return static_cast<int>(plans_.size() - 1);
}

Result<std::unique_ptr<CudnnAttention::Plan>> CudnnAttention::build(const AttnShape& a, bool bwd,
                                                                    const std::string* remembered) const {
  TPC_ASSIGN(const Cudnn* lib_, cudnn());
  auto p = std::make_unique<Plan>();
  p->scale = static_cast<float>(a.scale);
  double causalFrac = a.causal ? 0.5 : 1.0;
  p->flops = (bwd ? 10.0 : 4.0) * a.B * a.H * a.Tq * a.Tk * a.D * causalFrac;  // 2 (fwd) or 5 (bwd) GEMMs
  p->what = cat(version(), " flash attention ", dtypeName(a.dt), " [", a.B, ",", a.H, ",", a.Tq, ",", a.D, "]",
                a.causal ? " causal" : "", bwd ? (deterministic_ ? " backward" : " backward (dQ by atomics)") : " forward");
  GraphBuilder g(lib_, deterministic_);
  TPC_TRY(bwd ? buildBackward(g, a, *p) : buildForward(g, a, *p));

  // Operation graph -> heuristics (mode A) -> engine configs that finalize into plans: the first one, or
  // (autotune) the remembered one or each distinct one up to kMaxCandidates, for plan() to time.
  auto handle = static_cast<cudnnHandle_t>(handle_);
  TPC_ASSIGN(p->graph, g.create(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, "operation graph"));
  const auto& ops = g.ops();
  TPC_TRY(g.set(p->graph.get(), CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR,
                static_cast<int64_t>(ops.size()), ops.data(), "the operation graph"));
  TPC_TRY(g.set(p->graph.get(), CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle, "the operation graph"));
  TPC_TRY(g.finalize(p->graph.get(), cat("the ", p->what, " operation graph").c_str()));
  TPC_ASSIGN(Desc heur, g.create(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR, "heuristics"));
  cudnnBackendDescriptor_t gd = p->graph.get();
  cudnnBackendHeurMode_t mode = CUDNN_HEUR_MODE_A;
  TPC_TRY(g.set(heur.get(), CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &gd, "heuristics"));
  TPC_TRY(g.set(heur.get(), CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode, "heuristics"));
  TPC_TRY(g.finalize(heur.get(), cat("the heuristics of ", p->what).c_str()));
  int64_t count = 0;
  CUDNN_TRY(lib_->getAttribute(heur.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &count, nullptr),
            "counting the engine configs for ", p->what);
  if (count == 0) return makeError("cuDNN: no engine for ", p->what);
  std::vector<Desc> cfgs;
  std::vector<cudnnBackendDescriptor_t> raw;
  for (int64_t i = 0; i < count; ++i) {
    TPC_ASSIGN(Desc c, g.create(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, "engine config"));
    raw.push_back(c.get());
    cfgs.push_back(std::move(c));
  }
  CUDNN_TRY(lib_->getAttribute(heur.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, count, &count,
                               raw.data()),
            "reading the engine configs for ", p->what);
  std::string tried;
  std::set<std::string> seen;
  // Two passes when a remembered config is given: that one alone, then (not found) the usual ones.
  for (int pass = remembered ? 0 : 1; pass < 2 && p->candidates.empty(); ++pass) {
    const size_t limit = !autotune_ || pass == 0 ? 1 : kMaxCandidates;
    for (int64_t i = 0; i < count && p->candidates.size() < limit; ++i) {
      std::string engine = describeConfig(*lib_, raw[i]);
      if ((pass == 0 && engine != *remembered) || !seen.insert(cat(pass, engine)).second) continue;
      TPC_ASSIGN(Desc plan, g.create(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, "execution plan"));
      TPC_TRY(g.set(plan.get(), CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle, "an execution plan"));
      TPC_TRY(g.set(plan.get(), CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &raw[i],
                    "an execution plan"));
      cudnnStatus_t s = lib_->finalize(plan.get());
      if (s != CUDNN_STATUS_SUCCESS) {
        tried += cat(tried.empty() ? "" : "; ", "config ", i, ": ", cudnnError(*lib_, s));
        continue;
      }
      int64_t ws = 0, got = 0;
      CUDNN_TRY(lib_->getAttribute(plan.get(), CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1, &got, &ws),
                "reading the workspace size of ", p->what);
      // A config needing more workspace than the heuristics' first would raise the step's memory for its speed.
      if (!p->candidates.empty() && ws > p->candidates.front().workspace) continue;
      p->candidates.push_back({std::move(cfgs[i]), std::move(plan), std::move(engine), ws});
    }
  }
  if (p->candidates.empty()) return makeError("cuDNN: none of the ", count, " engine configs for ", p->what, " finalizes: ", tried);
  for (const Plan::Candidate& c : p->candidates) p->workspace = std::max(p->workspace, c.workspace);
  p->descriptors = g.take();
  return p;
}

Status CudnnAttention::checkOperations(const Node& n, bool deterministic) {
  TPC_ASSIGN(const Cudnn* lib, cudnn());
  TPC_ASSIGN(AttnShape a, attnShape(n));
  Plan p;
  GraphBuilder g(lib, deterministic);
  return isAttentionBackward(n) ? buildBackward(g, a, p) : buildForward(g, a, p);
}

int64_t CudnnAttention::workspaceBytes(int plan) const {
  const Plan& p = *plans_[plan];
  return p.intermediates + p.workspace;
}

Result<int> CudnnAttention::bind(int plan, const std::vector<void*>& operands, const std::vector<void*>& results,
                                 void* workspace) {
  TPC_ASSIGN(const Cudnn* lib_, cudnn());
  if (plan < 0 || plan >= static_cast<int>(plans_.size())) return makeError("cuDNN attention: no plan ", plan);
  auto b = std::make_unique<Binding>();
  TPC_TRY(makePack(lib_, *plans_[plan], operands, results, workspace, *b));
  bindings_.push_back(std::move(b));
  return static_cast<int>(bindings_.size() - 1);
}

Status CudnnAttention::run(int binding, cudaStream_t stream) const {
  TPC_ASSIGN(const Cudnn* lib_, cudnn());
  const Binding& b = *bindings_[binding];
  auto h = static_cast<cudnnHandle_t>(handle_);
  CUDNN_TRY(lib_->setStream(h, stream), "setting the stream");
  CUDNN_TRY(lib_->execute(h, b.plan->plan.get(), b.pack.get()), "running ", b.plan->what);
  return {};
}

const std::string& CudnnAttention::what(int plan) const { return plans_[plan]->what; }
const std::string& CudnnAttention::engine(int plan) const { return plans_[plan]->engine; }
double CudnnAttention::flops(int plan) const { return plans_[plan]->flops; }

namespace {

constexpr cudnnDataType_t kF32 = CUDNN_DATA_FLOAT;

// The node's tensor with row layout `r` as [B, H, T, D] (or its transpose [B, H, D, T]), the variant pack's
// entry `uid`.
Result<Tensor> rows(GraphBuilder& g, Plan& p, int64_t uid, const AttnShape& a, const AttnRows& r, bool transposed) {
  p.sources.push_back({uid, r.arg, r.off, static_cast<int>(dtypeSize(a.dt))});
  if (transposed) return g.tensor(uid, {a.B, a.H, a.D, a.Tq}, {r.sb, r.sh, 1, r.st}, cudnnType(a.dt));
  return g.tensor(uid, {a.B, a.H, a.Tq, a.D}, {r.sb, r.sh, r.st, 1}, cudnnType(a.dt));
}
// The lse (cuDNN's stats): f32 [B, H, T, 1], packed.
Result<Tensor> stats(GraphBuilder& g, Plan& p, const AttnShape& a) {
  p.sources.push_back({kStats, a.lse, 0, 4});
  return g.tensor(kStats, {a.B, a.H, a.Tq, 1}, {a.H * a.Tq, a.Tq, 1, 1}, kF32);
}
// A by-value f32 scalar read from `*value` (the plan's) at every run.
Result<Tensor> scalar(GraphBuilder& g, Plan& p, int64_t uid, const float* value) {
  p.sources.push_back({uid, KernelArg{ArgKind::Int64}, 0, 4, value});
  return g.tensor(uid, {1, 1, 1, 1}, {1, 1, 1, 1}, kF32, false, true);
}

// Where the causal mask hides a score: s -> (row >= col ? s : -inf) (the frontend's composite diagonal band mask).
Result<Tensor> causalMask(GraphBuilder& g, Plan& p, const Tensor& s) {
  TPC_ASSIGN(Tensor row, g.virt(s.dims, CUDNN_DATA_INT32));
  TPC_ASSIGN(Tensor col, g.virt(s.dims, CUDNN_DATA_INT32));
  TPC_ASSIGN(Tensor mask, g.virt(s.dims, CUDNN_DATA_BOOLEAN));
  TPC_ASSIGN(Tensor negInf, scalar(g, p, kNegInf, &p.negInf));
  TPC_ASSIGN(Tensor out, g.virt(s.dims));
  TPC_TRY(g.pointwise(CUDNN_POINTWISE_GEN_INDEX, s, nullptr, row, nullptr, 2));
  TPC_TRY(g.pointwise(CUDNN_POINTWISE_GEN_INDEX, s, nullptr, col, nullptr, 3));
  TPC_TRY(g.pointwise(CUDNN_POINTWISE_CMP_GE, row, &col, mask, nullptr, -1, CUDNN_DATA_BOOLEAN));
  TPC_TRY(g.pointwise(CUDNN_POINTWISE_BINARY_SELECT, s, &negInf, out, &mask));
  return out;
}
Result<Tensor> maybeCausal(GraphBuilder& g, Plan& p, const AttnShape& a, const Tensor& s) {
  if (!a.causal) return s;
  return causalMask(g, p, s);
}

Status buildForward(GraphBuilder& g, const AttnShape& a, Plan& p) {
  TPC_ASSIGN(Tensor q, rows(g, p, kQ, a, a.q, false));
  TPC_ASSIGN(Tensor kT, rows(g, p, kK, a, a.k, true));
  TPC_ASSIGN(Tensor v, rows(g, p, kV, a, a.v, false));
  TPC_ASSIGN(Tensor o, rows(g, p, kO, a, a.o, false));
  TPC_ASSIGN(Tensor lse, stats(g, p, a));
  TPC_ASSIGN(Tensor scale, scalar(g, p, kScale, &p.scale));
  // S = Q K^T, scaled, masked.
  TPC_ASSIGN(Tensor s, g.product(q, kT));
  TPC_ASSIGN(Tensor scaled, g.apply(CUDNN_POINTWISE_MUL, s, &scale));
  TPC_ASSIGN(Tensor masked, maybeCausal(g, p, a, scaled));
  // Softmax with stats = max + log(sum exp(s - max)); P = exp / sum in the I/O dtype for the second matmul.
  TPC_ASSIGN(Tensor mx, g.reduce(CUDNN_REDUCE_TENSOR_MAX, masked));
  TPC_ASSIGN(Tensor z, g.apply(CUDNN_POINTWISE_SUB, masked, &mx));
  TPC_ASSIGN(Tensor e, g.apply(CUDNN_POINTWISE_EXP, z));
  TPC_ASSIGN(Tensor sum, g.reduce(CUDNN_REDUCE_TENSOR_ADD, e));
  TPC_ASSIGN(Tensor logSum, g.apply(CUDNN_POINTWISE_LOG, sum));
  TPC_TRY(g.pointwise(CUDNN_POINTWISE_ADD, mx, &logSum, lse));
  TPC_ASSIGN(Tensor pr, g.apply(CUDNN_POINTWISE_DIV, e, &sum, cudnnType(a.dt)));
  return g.matmul(pr, v, o);
}

Status buildBackward(GraphBuilder& g, const AttnShape& a, Plan& p) {
  const cudnnDataType_t io = cudnnType(a.dt);
  const int64_t B = a.B, H = a.H, T = a.Tq, D = a.D;
  const std::vector<int64_t> bhtd{B, H, T, D}, bhtt{B, H, T, T}, transposed{H * T * T, T * T, 1, T};
  TPC_ASSIGN(Tensor q, rows(g, p, kQ, a, a.q, false));
  TPC_ASSIGN(Tensor kT, rows(g, p, kK, a, a.k, true));
  TPC_ASSIGN(Tensor vT, rows(g, p, kV, a, a.v, true));
  TPC_ASSIGN(Tensor o, rows(g, p, kO, a, a.o, false));
  TPC_ASSIGN(Tensor dO, rows(g, p, kDO, a, a.dout, false));
  TPC_ASSIGN(Tensor lse, stats(g, p, a));
  TPC_ASSIGN(Tensor dQ, rows(g, p, kDQ, a, a.dq, false));
  TPC_ASSIGN(Tensor dK, rows(g, p, kDK, a, a.dk, false));
  TPC_ASSIGN(Tensor dV, rows(g, p, kDV, a, a.dv, false));
  // Ours in the workspace, as the frontend keeps them: dQ accumulated in f32 (not in the deterministic
  // graph, whose last matmul writes dQ itself, as the frontend's deterministic mode builds it), and
  // rowsum(dO * O).
  const int64_t accumBytes = g.deterministic() ? 0 : B * H * T * D * 4, sumBytes = B * H * T * 4;
  Tensor dQAccum;
  if (!g.deterministic()) {
    TPC_ASSIGN(dQAccum, g.tensor(kDQAccum, bhtd, {H * T * D, T * D, D, 1}, kF32));
    p.sources.push_back({kDQAccum, KernelArg{ArgKind::Workspace, 0}, 0, 4});
  }
  TPC_ASSIGN(Tensor softmaxSum, g.tensor(kSoftmaxSum, {B, H, T, 1}, {H * T, T, 1, 1}, kF32));
  p.sources.push_back({kSoftmaxSum, KernelArg{ArgKind::Workspace, accumBytes}, 0, 4});
  p.intermediates = (accumBytes + sumBytes + 255) / 256 * 256;
  TPC_ASSIGN(Tensor scale, scalar(g, p, kScale, &p.scale));
  TPC_ASSIGN(Tensor one, scalar(g, p, kOne, &p.one));
  // softmax_sum = rowsum(dO * O). dO * O's strides are the frontend's, odd as they are: the engines match them.
  TPC_ASSIGN(Tensor dOO, g.tensor(0, bhtd, {H * T * D, T * D, H * D, 1}, kF32, true));
  TPC_TRY(g.pointwise(CUDNN_POINTWISE_MUL, dO, &o, dOO));
  TPC_ASSIGN(Tensor rowSum, g.reduce(CUDNN_REDUCE_TENSOR_ADD, dOO));
  TPC_TRY(g.pointwise(CUDNN_POINTWISE_MUL, rowSum, &one, softmaxSum));
  // P = exp(scale Q K^T - stats), masked.
  TPC_ASSIGN(Tensor s, g.product(q, kT));
  TPC_ASSIGN(Tensor scaled, g.apply(CUDNN_POINTWISE_MUL, s, &scale));
  TPC_ASSIGN(Tensor shifted, g.apply(CUDNN_POINTWISE_SUB, scaled, &lse));
  TPC_ASSIGN(Tensor masked, maybeCausal(g, p, a, shifted));
  TPC_ASSIGN(Tensor pr, g.apply(CUDNN_POINTWISE_EXP, masked));
  // dV = P^T dO.
  TPC_ASSIGN(Tensor pT, g.tensor(0, bhtt, transposed, io, true));
  TPC_TRY(g.reshape(pr, pT));
  TPC_TRY(g.matmul(pT, dO, dV));
  // dS = P (dO V^T - softmax_sum) scale.
  TPC_ASSIGN(Tensor dP, g.product(dO, vT));
  TPC_ASSIGN(Tensor t1, g.apply(CUDNN_POINTWISE_SUB, dP, &softmaxSum));
  TPC_ASSIGN(Tensor t2, g.apply(CUDNN_POINTWISE_MUL, t1, &pr));
  TPC_ASSIGN(Tensor dS, g.apply(CUDNN_POINTWISE_MUL, t2, &scale));
  // dK = dS^T Q; dQ = dS K (deterministic: written by the matmul; else accumulated in f32, then copied. The
  // frontend memsets that accumulator only below cuDNN 9.6; on 9.14 the GPU test, with the workspace filled
  // with NaN bytes, matched the CPU backend with this graph).
  TPC_ASSIGN(Tensor dST, g.tensor(0, bhtt, transposed, io, true));
  TPC_TRY(g.reshape(dS, dST));
  TPC_TRY(g.matmul(dST, q, dK));
  TPC_ASSIGN(Tensor k, g.tensor(0, bhtd, {a.k.sb, a.k.sh, a.k.st, 1}, kF32, true));
  TPC_TRY(g.reshape(kT, k));
  if (g.deterministic()) return g.matmul(dS, k, dQ);
  TPC_TRY(g.matmul(dS, k, dQAccum));
  return g.pointwise(CUDNN_POINTWISE_IDENTITY, dQAccum, nullptr, dQ);
}

}  // namespace

}  // namespace tpc::cuda
