// The CPU executor: resolves every node's kernel once (an ops.def X-macro table), computes each value's
// last use, then runs the nodes in program order, freeing each buffer right after its last reader.
#include "runtime/cpu/cpu_executor.h"

#include <chrono>
#include <climits>
#include <limits>
#include <cmath>
#include <map>
#include <thread>

#include "ir/printer.h"

#include "runtime/cpu/communicator.h"
#include "runtime/cpu/kernels.h"

namespace tpc {
namespace cpu {
namespace {

template <class T>
using Kernel = Status (*)(KernelArgs<T>&);

template <class T>
Kernel<T> kernelFor(OpKind op) {
  static const Kernel<T> table[] = {
#define OP(Enum, name, nops, nres, traits, attrs) &kernel##Enum<T>,
#include "ir/ops.def"
#undef OP
  };
  return table[static_cast<size_t>(op)];
}

// bf16/f16 values are kept rounded to their 16-bit type.
template <class T>
void roundToDType(Buf<T>& b) {
  if (b.type.dtype == DType::bf16)
    for (T& v : b.f) v = static_cast<T>(bf16ToFloat(floatToBf16(static_cast<float>(v))));
  else if (b.type.dtype == DType::f16)
    for (T& v : b.f) v = static_cast<T>(f16ToFloat(floatToF16(static_cast<float>(v))));
}

template <class T>
class Executor final : public CpuExecutor {
 public:
  Executor(const Graph& g, CpuOptions options)
      : g_(g), options_(std::move(options)), pool_(options_.threads),
        comm_(options_.communicator ? options_.communicator : std::shared_ptr<Communicator>(createSingleRankCommunicator())) {}

  Status plan() {
    auto slotOf = [&](const Value* v) {
      auto it = slots_.find(v);
      if (it != slots_.end()) return it->second;
      int s = static_cast<int>(slots_.size());
      slots_[v] = s;
      return s;
    };
    for (Value* v : g_.inputs()) inputSlots_.push_back(slotOf(v));
    for (Value* v : g_.params()) paramSlots_.push_back(slotOf(v));
    for (Node* n : g_.nodes()) {
      if (n->has(traits::Collective)) {
        const std::string& axis = n->getStr("axis");
        int64_t want = g_.mesh().axisSize(axis);
        if (want != comm_->axisSize(axis)) return meshMismatch(std::string(n->opName()), axis, want, comm_->axisSize(axis));
      }
      Step s{n, kernelFor<T>(n->op()), {}, {}, {}};
      for (Value* v : n->operands()) s.in.push_back(slotOf(v));
      for (Value* v : n->results()) s.out.push_back(slotOf(v));
      steps_.push_back(std::move(s));
    }
    for (const GraphOutput& o : g_.outputs()) outputSlots_.push_back(slotOf(o.value));
    types_.resize(slots_.size());
    valueOf_.resize(slots_.size());
    for (auto& [v, s] : slots_) {
      types_[s] = v->type();
      valueOf_[s] = v;
    }
    if (!options_.faults.nanValue.empty()) {
      ValueNames names(g_);
      for (auto& [v, s] : slots_)
        if (names(v) == options_.faults.nanValue) nanSlot_ = s;
      if (nanSlot_ < 0)
        return makeError("test fault: graph @", g_.name(), " has no value ", options_.faults.nanValue,
                         " (name it as `tpc dump` prints it, e.g. %d.wte or %57)");
      if (!isFloat(types_[nanSlot_].dtype))
        return makeError("test fault: ", options_.faults.nanValue, " is ", types_[nanSlot_].str(), ", not a float value");
    }

    // Last reader of every slot: -1 = none (freed as soon as it exists), INT_MAX = an output (kept).
    std::vector<int> last(slots_.size(), -1);
    for (size_t k = 0; k < steps_.size(); ++k)
      for (int s : steps_[k].in) last[s] = static_cast<int>(k);
    for (int s : outputSlots_) last[s] = INT_MAX;
    for (int s : inputSlots_) if (last[s] == -1) freeAtStart_.push_back(s);
    for (int s : paramSlots_) if (last[s] == -1) freeAtStart_.push_back(s);
    for (size_t k = 0; k < steps_.size(); ++k) {
      for (int s : steps_[k].out)
        if (last[s] == -1) steps_[k].freeAfter.push_back(s);
    }
    for (size_t s = 0; s < last.size(); ++s)
      if (last[s] >= 0 && last[s] != INT_MAX) steps_[last[s]].freeAfter.push_back(static_cast<int>(s));
    return {};
  }

  Result<std::vector<HostTensor>> run(const std::vector<const HostTensor*>& inputs,
                                      const std::vector<const HostTensor*>& params, int64_t step) override {
    if (inputs.size() != g_.inputs().size() || params.size() != g_.params().size())
      return makeError("cpu executor: graph @", g_.name(), " takes ", g_.inputs().size(), " inputs and ",
                       g_.params().size(), " params, got ", inputs.size(), " and ", params.size());
    bufs_.clear();
    bufs_.resize(slots_.size());
    live_ = peak_ = 0;
    for (size_t k = 0; k < inputs.size(); ++k) TPC_TRY(load(g_.inputs()[k], inputSlots_[k], inputs[k], "input"));
    for (size_t k = 0; k < params.size(); ++k) TPC_TRY(load(g_.params()[k], paramSlots_[k], params[k], "param"));
    const bool faultStep = options_.faults.step == step;
    first_.reset();
    if (faultStep && nanSlot_ >= 0 && bufs_[nanSlot_]) injectNan(*bufs_[nanSlot_]);
    if (check_) {
      for (size_t k = 0; k < inputs.size(); ++k) checkFinite(inputSlots_[k], -1, "input");
      for (size_t k = 0; k < params.size(); ++k) checkFinite(paramSlots_[k], -1, "param");
    }
    for (int s : freeAtStart_) release(s);

    auto fail = [&](const std::string& error) -> Error {
      for (size_t s = 0; s < bufs_.size(); ++s) release(static_cast<int>(s));
      bufs_.clear();
      return Error{error};
    };
    comm_->setStep(step);
    RunContext ctx{pool_, *comm_, options_.seed, step};
    for (size_t k = 0; k < steps_.size(); ++k) {
      const Step& st = steps_[k];
      if (faultStep && options_.faults.stallRank == comm_->rank() && st.node->has(traits::Collective)) {
        return fail(stall());
      }
      KernelArgs<T> args{*st.node, {}, {}, ctx};
      for (int s : st.in) args.in.push_back(bufs_[s].get());
      for (int s : st.out) {
        allocate(s);
        args.out.push_back(bufs_[s].get());
      }
      Status status = st.fn(args);
      if (!status.ok()) return fail(status.error());
      for (int s : st.out) {
        roundToDType(*bufs_[s]);
        if (faultStep && s == nanSlot_ && (options_.faults.nanRank < 0 || options_.faults.nanRank == comm_->rank()))
          injectNan(*bufs_[s]);
        if (check_) checkFinite(s, static_cast<int64_t>(k), nullptr);
      }
      for (int s : st.freeAfter) release(s);
    }

    std::vector<HostTensor> out;
    for (int s : outputSlots_) out.push_back(toHost(*bufs_[s]));
    for (size_t s = 0; s < bufs_.size(); ++s) release(static_cast<int>(s));
    bufs_.clear();
    live_ = 0;
    return out;
  }

  void setFiniteCheck(bool on) override { check_ = on; }
  const std::optional<NonFiniteValue>& firstNonFinite() const override { return first_; }

  int64_t peakLiveBytes() const override { return peak_; }

 private:
  struct Step {
    const Node* node;
    Kernel<T> fn;
    std::vector<int> in, out, freeAfter;
  };

  // Keeps the first non-finite value (checking mode): `index` is the node's position, -1 for an input
  // or parameter (`what`).
  void checkFinite(int s, int64_t index, const char* what) {
    if (first_ || !bufs_[s] || !bufs_[s]->isFloatBuf()) return;
    const std::vector<T>& f = bufs_[s]->f;
    for (size_t i = 0; i < f.size(); ++i) {
      if (std::isfinite(f[i])) continue;
      ValueNames names(g_);
      NonFiniteValue nf;
      nf.value = names(valueOf_[s]);
      nf.node = index < 0 ? std::string(what) : printNode(*steps_[index].node, names);
      nf.index = index;
      nf.numNodes = static_cast<int64_t>(steps_.size());
      nf.element = static_cast<int64_t>(i);
      nf.sample = static_cast<double>(f[i]);
      first_ = std::move(nf);
      return;
    }
  }

  // The stall fault: wait, as a stuck rank would, until the other ranks give up on us and abort the mesh.
  // Bounded so that a broken timeout still ends the test (as a failure, not a hang).
  std::string stall() {
    const auto limit = std::chrono::steady_clock::now() + std::chrono::minutes(10);
    while (!comm_->abortReason()) {
      if (std::chrono::steady_clock::now() > limit)
        return cat("rank ", comm_->rank(), ": stalled by a test fault for 10 minutes, and no collective timed out");
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    return cat("rank ", comm_->rank(), ": stalled by a test fault before its first collective of the step");
  }
  static void injectNan(Buf<T>& b) {
    if (!b.f.empty()) b.f[0] = std::numeric_limits<T>::quiet_NaN();
  }

  // Storage is recycled within and across runs: large fresh allocations are mmap'd by malloc and every
  // page then faults on first touch, which costs more than the kernels themselves on small models.
  template <class E>
  static std::vector<E> takeSpare(std::multimap<size_t, std::vector<E>>& spare, size_t n) {
    auto it = spare.lower_bound(n);
    if (it == spare.end() || it->first > 2 * n + 1024) return std::vector<E>(n);
    std::vector<E> v = std::move(it->second);
    spare.erase(it);
    v.assign(n, E(0));
    return v;
  }
  void allocate(int s) {
    auto b = std::make_unique<Buf<T>>();
    b->type = types_[s];
    size_t n = static_cast<size_t>(b->numel());
    if (b->isFloatBuf()) b->f = takeSpare(spareF_, n);
    else b->i = takeSpare(spareI_, n);
    bufs_[s] = std::move(b);
    live_ += bufs_[s]->bytes();
    peak_ = std::max(peak_, live_);
  }
  void release(int s) {
    if (!bufs_[s]) return;
    live_ -= bufs_[s]->bytes();
    Buf<T>& b = *bufs_[s];
    if (b.f.capacity()) spareF_.emplace(b.f.capacity(), std::move(b.f));
    if (b.i.capacity()) spareI_.emplace(b.i.capacity(), std::move(b.i));
    bufs_[s].reset();
  }

  Status load(const Value* v, int s, const HostTensor* t, const char* what) {
    std::string name = v->hasName() ? v->name() : std::to_string(v->id());
    if (!t || t->empty()) return makeError("cpu executor: ", what, " %", name, " is missing");
    if (t->shape() != v->shape() || isFloat(t->dtype()) != isFloat(v->dtype()))
      return makeError("cpu executor: ", what, " %", name, " must be ", v->type().str(), ", got ", t->type().str());
    if (bufs_[s]) return {};  // the same value passed twice
    allocate(s);
    Buf<T>& b = *bufs_[s];
    int64_t n = b.numel();
    if (b.isFloatBuf()) {
      if (t->dtype() == DType::f32) for (int64_t i = 0; i < n; ++i) b.f[i] = static_cast<T>(t->data<float>()[i]);
      else if (t->dtype() == DType::f64) for (int64_t i = 0; i < n; ++i) b.f[i] = static_cast<T>(t->data<double>()[i]);
      else for (int64_t i = 0; i < n; ++i) b.f[i] = static_cast<T>(t->getAsDouble(i));
      roundToDType(b);
    } else if (t->dtype() == DType::i32) {
      for (int64_t i = 0; i < n; ++i) b.i[i] = t->data<int32_t>()[i];
    } else if (t->dtype() == DType::i64) {
      std::copy(t->data<int64_t>(), t->data<int64_t>() + n, b.i.begin());
    } else {
      for (int64_t i = 0; i < n; ++i) b.i[i] = static_cast<int64_t>(t->getAsDouble(i));
    }
    return {};
  }

  HostTensor toHost(const Buf<T>& b) const {
    if (b.isFloatBuf()) {
      HostTensor t(TensorType(sizeof(T) == 8 ? DType::f64 : DType::f32, b.shape()));
      std::copy(b.f.begin(), b.f.end(), t.data<T>());
      return t;
    }
    HostTensor t(b.type);
    for (int64_t i = 0; i < b.numel(); ++i) t.setFromDouble(i, static_cast<double>(b.i[i]));
    if (b.type.dtype == DType::i64) std::copy(b.i.begin(), b.i.end(), t.data<int64_t>());
    return t;
  }

  const Graph& g_;
  CpuOptions options_;
  ThreadPool pool_;
  std::shared_ptr<Communicator> comm_;
  llvm::DenseMap<const Value*, int> slots_;
  std::vector<TensorType> types_;
  std::vector<const Value*> valueOf_;
  int nanSlot_ = -1;
  bool check_ = false;
  std::optional<NonFiniteValue> first_;
  std::vector<Step> steps_;
  std::vector<int> inputSlots_, paramSlots_, outputSlots_, freeAtStart_;
  std::vector<std::unique_ptr<Buf<T>>> bufs_;
  std::multimap<size_t, std::vector<T>> spareF_;
  std::multimap<size_t, std::vector<int64_t>> spareI_;
  int64_t live_ = 0, peak_ = 0;
};

template <class T>
Result<std::unique_ptr<CpuExecutor>> make(const Graph& g, CpuOptions options) {
  auto e = std::make_unique<Executor<T>>(g, std::move(options));
  TPC_TRY(e->plan());
  return std::unique_ptr<CpuExecutor>(std::move(e));
}

}  // namespace
}  // namespace cpu

Result<std::unique_ptr<CpuExecutor>> CpuExecutor::create(const Graph& g, CpuOptions options) {
  if (options.fp64) return cpu::make<double>(g, std::move(options));
  return cpu::make<float>(g, std::move(options));
}

}  // namespace tpc
