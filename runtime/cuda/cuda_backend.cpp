// CudaBackend: per-rank programs (lowering, memory plan, launches with resolved addresses), the CUDA
// graph capture of all ranks' launches with the virtual-rank collectives between them, and the host side
// of a step (batch in, replay, outputs out).
#include "runtime/cuda/cuda_backend.h"

#include <cuda_runtime_api.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <unordered_map>

#include "runtime/cpu/cpu_mesh_backend.h"
#include "runtime/cuda/cublaslt_matmul.h"
#include "runtime/cuda/cuda_libraries.h"
#include "runtime/cuda/lowering.h"
#include "runtime/cuda/memory_plan.h"
#include "runtime/cuda/nvrtc_compiler.h"
#include "runtime/cuda/virtual_collectives.h"

namespace tpc {
namespace {

using namespace cuda;

#define CU_TRY(expr, ...)                                                                    \
  do {                                                                                       \
    cudaError_t e_ = (expr);                                                                 \
    if (e_ != cudaSuccess) return makeError("cuda: ", __VA_ARGS__, ": ", cudaGetErrorString(e_)); \
  } while (0)

std::string mib(int64_t b) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f MiB", static_cast<double>(b) / (1 << 20));
  return buf;
}

std::string valueName(const Value* v) { return v->hasName() ? "%" + v->name() : cat("%", v->id()); }

struct Launch {
  enum Kind { Kernel, Matmul, Memset, Copy } kind = Kernel;
  CUfunction fn = nullptr;
  Dim3 grid, block;
  uint32_t smem = 0;
  std::vector<uint64_t> argv;
  int matmul = -1;
  const void* a = nullptr;
  const void* b = nullptr;
  void* c = nullptr;
  size_t bytes = 0;
  std::string what;  // the node, for errors
};

struct Rank {
  std::unique_ptr<Graph> graph;
  llvm::DenseMap<const Value*, void*> addr;
  std::map<std::string, std::pair<const Value*, void*>> params;  // name -> (param value, buffer)
  std::vector<void*> allocations;
  void* arena = nullptr;
  int64_t arenaBytes = 0, stateBytes = 0, inputBytes = 0;
  std::vector<std::vector<Launch>> segments;  // split at cross-rank collectives
  std::vector<const Node*> collectives;
};

class CudaBackend final : public Backend {
 public:
  CudaBackend(std::vector<std::unique_ptr<Graph>> graphs, CudaOptions options) : options_(std::move(options)) {
    for (auto& g : graphs) {
      ranks_.emplace_back();
      ranks_.back().graph = std::move(g);
    }
  }
  ~CudaBackend() override { release(); }

  std::string name() const override {
    return cat("cuda (", deviceName_, ranks_.size() > 1 ? cat(", ", ranks_.size(), " virtual ranks") : "", ")");
  }
  int64_t deviceMemoryInUse() const override {
    size_t freeB = 0, total = 0;
    if (cudaMemGetInfo(&freeB, &total) != cudaSuccess) return -1;
    return static_cast<int64_t>(total - freeB);
  }
  int64_t launchesPerStep() const override { return launchCount_; }

  Status prepare(const Graph& step, const TensorMap& state) override {
    release();
    if (ranks_.empty()) {
      ranks_.emplace_back();
      ranks_.back().graph = step.clone();
    }
    if (!ranks_[0].graph->mesh().empty() && ranks_[0].graph->mesh().numRanks() != static_cast<int64_t>(ranks_.size()))
      return makeError("cuda backend: ", ranks_[0].graph->mesh().str(), " has ", ranks_[0].graph->mesh().numRanks(),
                       " ranks, but ", ranks_.size(), " rank graphs were given");
    CU_TRY(cudaSetDevice(options_.device), "cannot use GPU ", options_.device);
    CU_TRY(cudaFree(nullptr), "cannot initialize GPU ", options_.device);
    cudaDeviceProp prop{};
    CU_TRY(cudaGetDeviceProperties(&prop, options_.device), "device properties");
    deviceName_ = prop.name;
    ctx_.smMajor = prop.major;
    ctx_.smMinor = prop.minor;
    ctx_.maxSharedBytes = static_cast<int64_t>(prop.sharedMemPerBlockOptin);
    TPC_ASSIGN(driver_, driver());
    compiler_ = std::make_unique<NvrtcCompiler>(prop.major * 10 + prop.minor, options_.cacheDir);
    TPC_ASSIGN(matmul_, CublasLtMatmul::create(32 << 20));
    CU_TRY(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "stream");
    CU_TRY(cudaMalloc(&stepWord_, sizeof(int64_t)), "step word");
    CU_TRY(cudaMalloc(&matmulWorkspace_, matmul_->workspaceBytes()), "cuBLASLt workspace");

    auto t0 = std::chrono::steady_clock::now();
    // Lower every node of every rank (pure), plan the matmuls, then size the memory.
    std::vector<std::vector<NodeLowering>> lowerings(ranks_.size());
    std::vector<std::vector<int>> matmulPlans(ranks_.size());
    matmulCalls.assign(ranks_.size(), {});
    for (size_t r = 0; r < ranks_.size(); ++r) {
      for (Node* n : ranks_[r].graph->nodes()) {
        NodeExec how = nodeExec(*n);
        lowerings[r].emplace_back();
        matmulPlans[r].push_back(-1);
        if (how == NodeExec::Kernels) {
          auto l = lowerNode(*n, ctx_);
          if (!l.ok()) return makeError(rankPrefix(r), "lowering ", n->opName(), " -> ", valueName(n->result()), ": ", l.error());
          lowerings[r].back() = std::move(l).value();
        } else if (how == NodeExec::Matmul) {
          matmulCalls[r].resize(matmulPlans[r].size());
          auto id = matmul_->plan(*n, &matmulCalls[r].back());
          if (!id.ok()) return makeError(rankPrefix(r), id.error());
          matmulPlans[r].back() = *id;
        }
      }
    }
    std::vector<std::vector<PlannedBuffer>> plans(ranks_.size());
    std::vector<llvm::DenseMap<const Value*, int>> bufferOf(ranks_.size());
    std::vector<std::vector<int>> workspaceOf(ranks_.size());
    std::vector<std::vector<std::pair<const Value*, std::string>>> paramCopies(ranks_.size());
    int64_t needed = static_cast<int64_t>(matmul_->workspaceBytes());
    for (size_t r = 0; r < ranks_.size(); ++r) {
      TPC_TRY(planRank(r, lowerings[r], plans[r], bufferOf[r], workspaceOf[r], paramCopies[r]));
      needed += ranks_[r].arenaBytes + ranks_[r].stateBytes + ranks_[r].inputBytes;
    }
    size_t freeB = 0, totalB = 0;
    CU_TRY(cudaMemGetInfo(&freeB, &totalB), "memory info");
    int64_t arenas = 0, stateB = 0;
    for (auto& rk : ranks_) arenas += rk.arenaBytes, stateB += rk.stateBytes;
    if (options_.verbose)
      std::printf("cuda: memory plan on GPU %d (%s): activations arena %s (planned peak%s), parameters and optimizer "
                  "state %s, batch %s, cuBLASLt workspace %s: %s of %s free\n",
                  options_.device, deviceName_.c_str(), mib(arenas).c_str(),
                  ranks_.size() > 1 ? cat(", ", ranks_.size(), " ranks").c_str() : "", mib(stateB).c_str(),
                  mib(needed - arenas - stateB - static_cast<int64_t>(matmul_->workspaceBytes())).c_str(),
                  mib(matmul_->workspaceBytes()).c_str(), mib(needed).c_str(), mib(static_cast<int64_t>(freeB)).c_str());
    if (needed > static_cast<int64_t>(freeB) * 97 / 100)
      return makeError("cuda: the training step needs ", mib(needed), " of GPU memory (activations ", mib(arenas),
                       ", parameters and optimizer state ", mib(stateB), ") but only ", mib(static_cast<int64_t>(freeB)),
                       " are free on GPU ", options_.device, " (", deviceName_,
                       "); use a smaller --micro-batch-size (or recompute) to lower the activations");

    for (size_t r = 0; r < ranks_.size(); ++r) {
      TPC_TRY(allocateRank(r, state, plans[r], bufferOf[r]));
      TPC_TRY(buildLaunches(r, lowerings[r], matmulPlans[r], plans[r], workspaceOf[r], paramCopies[r]));
    }
    TPC_TRY(assemble());
    auto& st = compiler_->stats();
    if (options_.verbose)
      std::printf("cuda: %lld launches per step (%d cuBLASLt matmul shapes); kernels: %d compiled by NVRTC in %.1fs, %d "
                  "from the cache %s; prepared in %.1fs\n",
                  static_cast<long long>(launchCount_), matmul_->distinctShapes(), st.compiled, st.seconds, st.cacheHits,
                  compiler_->cacheDir().c_str(),
                  std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    debug_ = std::getenv("TPC_CUDA_DEBUG") != nullptr;
    if (!debug_) TPC_TRY(capture());
    prepared_ = true;
    return {};
  }

  Result<TensorMap> step(const TensorMap& inputs, int64_t stepIndex) override {
    if (!prepared_) return makeError("cuda backend: step() before a successful prepare()");
    const Mesh& mesh = ranks_[0].graph->mesh();
    for (size_t r = 0; r < ranks_.size(); ++r) {
      for (Value* v : ranks_[r].graph->inputs()) {
        auto it = inputs.find(v->name());
        if (it == inputs.end()) return makeError("cuda backend: missing input %", v->name(), " (", v->type().str(), ")");
        HostTensor t = it->second;
        if (!mesh.empty()) {
          auto local = sliceForRank(t, v->placement(), mesh, static_cast<int64_t>(r));
          if (!local.ok()) return makeError("cuda backend: input %", v->name(), ": ", local.error());
          t = std::move(local).value();
        }
        if (t.shape() != v->shape())
          return makeError("cuda backend: input %", v->name(), " must be ", v->type().str(), ", got ", t.type().str());
        if (t.dtype() != v->dtype()) t = t.convertTo(v->dtype());
        staging_.push_back(t);  // kept until the copy is done
        CU_TRY(cudaMemcpyAsync(ranks_[r].addr[v], t.raw(), t.bytes(), cudaMemcpyHostToDevice, stream_), "copying input %",
               v->name());
      }
    }
    stepHost_ = stepIndex;
    CU_TRY(cudaMemcpyAsync(stepWord_, &stepHost_, sizeof stepHost_, cudaMemcpyHostToDevice, stream_), "step word");
    if (debug_) {
      TPC_TRY(enqueueAll(true, stepIndex));
    } else {
      cudaError_t e = cudaGraphLaunch(graphExec_, stream_);
      if (e != cudaSuccess) return makeError("cuda: step ", stepIndex, ": launching the step graph: ", cudaGetErrorString(e));
    }
    // Outputs that do not update a parameter, from rank 0.
    const Graph& g0 = *ranks_[0].graph;
    std::vector<std::pair<std::string, HostTensor>> outs;
    for (size_t i = 0; i < g0.outputs().size(); ++i) {
      std::string name = g0.outputName(i);
      if (ranks_[0].params.count(name)) continue;
      const Value* v = g0.outputs()[i].value;
      HostTensor t(v->type());
      CU_TRY(cudaMemcpyAsync(t.raw(), ranks_[0].addr[v], t.bytes(), cudaMemcpyDeviceToHost, stream_), "reading output %", name);
      outs.emplace_back(name, t);
    }
    cudaError_t e = cudaStreamSynchronize(stream_);
    staging_.clear();
    if (e != cudaSuccess)
      return makeError("cuda: step ", stepIndex, " failed on GPU ", options_.device, ": ", cudaGetErrorString(e),
                       " (run with TPC_CUDA_DEBUG=1 to find the kernel)");
    TensorMap result;
    for (auto& [name, t] : outs) result[name] = isFloat(t.dtype()) && t.dtype() != DType::f32 ? t.convertTo(DType::f32) : t;
    return result;
  }

  Result<HostTensor> readState(const std::string& name) const override {
    if (ranks_.empty() || !ranks_[0].params.count(name)) return makeError("cuda backend: no state tensor named '", name, "'");
    const Mesh& mesh = ranks_[0].graph->mesh();
    auto fetch = [&](size_t r) -> Result<HostTensor> {
      auto [p, buf] = ranks_[r].params.at(name);
      HostTensor t(p->type());
      CU_TRY(cudaMemcpy(t.raw(), buf, t.bytes(), cudaMemcpyDeviceToHost), "reading %", name);
      return isFloat(t.dtype()) && t.dtype() != DType::f32 ? t.convertTo(DType::f32) : t;
    };
    if (mesh.empty()) return fetch(0);
    TPC_ASSIGN(HostTensor l0, fetch(0));
    const Value* p0 = ranks_[0].params.at(name).first;
    TPC_ASSIGN(Shape gshape, globalShape(l0.shape(), p0->placement(), mesh));
    HostTensor global(TensorType(l0.dtype(), gshape));
    for (size_t r = 0; r < ranks_.size(); ++r) {
      TPC_ASSIGN(HostTensor l, fetch(r));
      TPC_TRY(placeIntoGlobal(l, ranks_[r].params.at(name).first->placement(), mesh, static_cast<int64_t>(r), global));
    }
    return global;
  }

 private:
  std::string rankPrefix(size_t r) const { return ranks_.size() > 1 ? cat("rank ", r, ": ") : ""; }

  // Buffers and their lifetimes; outputs that replace a parameter write into it when that is safe.
  Status planRank(size_t r, const std::vector<NodeLowering>& lowerings, std::vector<PlannedBuffer>& plan,
                  llvm::DenseMap<const Value*, int>& bufferOf, std::vector<int>& workspaceOf,
                  std::vector<std::pair<const Value*, std::string>>& paramCopies) {
    Rank& rk = ranks_[r];
    const Graph& g = *rk.graph;
    std::vector<Node*> nodes = g.nodeVector();
    int end = static_cast<int>(nodes.size());
    llvm::DenseMap<const Node*, int> index;
    for (int k = 0; k < end; ++k) index[nodes[k]] = k;
    llvm::DenseMap<const Value*, int> lastUse;
    for (int k = 0; k < end; ++k)
      for (Value* v : nodes[k]->operands()) lastUse[v] = k;
    for (Value* p : g.params()) {
      rk.params[p->name()] = {p, nullptr};
      rk.stateBytes += (p->type().bytes() + 255) / 256 * 256;
    }
    for (Value* v : g.inputs()) rk.inputBytes += (v->type().bytes() + 255) / 256 * 256;
    // Outputs named like a parameter: written in place when the node is elementwise-like (optimizer,
    // elementwise) and nothing reads the old value after it; otherwise copied at the end.
    llvm::DenseMap<const Value*, std::string> inPlace;
    for (size_t i = 0; i < g.outputs().size(); ++i) {
      std::string name = g.outputName(i);
      auto it = rk.params.find(name);
      if (it == rk.params.end()) continue;
      const Value* v = g.outputs()[i].value;
      const Value* p = it->second.first;
      if (v == p) continue;
      bool safe = v->def() && (v->def()->has(traits::Optimizer) || v->def()->has(traits::Elementwise)) && !inPlace.count(v);
      if (safe) {
        int d = index[v->def()];
        auto lu = lastUse.find(p);
        safe = lu == lastUse.end() || lu->second <= d;
        // The node may read the old parameter only at the same element it writes: elementwise-like ops do.
      }
      if (safe) inPlace[v] = name;
      else paramCopies.push_back({v, name});
    }
    for (const GraphOutput& o : g.outputs()) lastUse[o.value] = end;
    for (const auto& pc : paramCopies) lastUse[pc.first] = end;
    inPlace_.push_back(inPlace);
    for (int k = 0; k < end; ++k) {
      for (Value* v : nodes[k]->results()) {
        if (inPlace.count(v)) continue;
        auto lu = lastUse.find(v);
        bufferOf[v] = static_cast<int>(plan.size());
        plan.push_back({v->type().bytes(), k, lu == lastUse.end() ? k : lu->second});
      }
      workspaceOf.push_back(-1);
      if (lowerings[k].workspaceBytes > 0) {
        workspaceOf.back() = static_cast<int>(plan.size());
        plan.push_back({lowerings[k].workspaceBytes, k, k});
      }
    }
    rk.arenaBytes = planMemory(plan);
    return {};
  }

  Status allocateRank(size_t r, const TensorMap& state, const std::vector<PlannedBuffer>& plan,
                      const llvm::DenseMap<const Value*, int>& bufferOf) {
    Rank& rk = ranks_[r];
    const Mesh& mesh = rk.graph->mesh();
    CU_TRY(cudaMalloc(&rk.arena, std::max<int64_t>(rk.arenaBytes, 256)), rankPrefix(r), "allocating the ", mib(rk.arenaBytes),
           " activations arena");
    rk.allocations.push_back(rk.arena);
    for (auto& [v, b] : bufferOf) rk.addr[v] = static_cast<char*>(rk.arena) + plan[b].offset;
    for (Value* v : rk.graph->inputs()) {
      void* p = nullptr;
      CU_TRY(cudaMalloc(&p, std::max<int64_t>(v->type().bytes(), 1)), "allocating input %", v->name());
      rk.allocations.push_back(p);
      rk.addr[v] = p;
    }
    for (Value* p : rk.graph->params()) {
      auto it = state.find(p->name());
      if (it == state.end())
        return makeError("cuda backend: no initial value for parameter %", p->name(), " of graph @", rk.graph->name());
      HostTensor t = it->second;
      if (!mesh.empty()) {
        auto local = sliceForRank(t, p->placement(), mesh, static_cast<int64_t>(r));
        if (!local.ok()) return makeError("cuda backend: parameter %", p->name(), ": ", local.error());
        t = std::move(local).value();
      }
      if (t.shape() != p->shape())
        return makeError("cuda backend: parameter %", p->name(), " must be ", p->type().str(), ", got ", t.type().str());
      if (t.dtype() != p->dtype()) t = t.convertTo(p->dtype());
      void* buf = nullptr;
      CU_TRY(cudaMalloc(&buf, std::max<int64_t>(t.bytes(), 1)), "allocating parameter %", p->name());
      rk.allocations.push_back(buf);
      CU_TRY(cudaMemcpy(buf, t.raw(), t.bytes(), cudaMemcpyHostToDevice), "uploading parameter %", p->name());
      rk.addr[p] = buf;
      rk.params[p->name()].second = buf;
    }
    for (auto& [v, name] : inPlace_[r]) rk.addr[v] = rk.params[name].second;
    return {};
  }

  Result<CUfunction> function(const KernelSpec& k, const std::string& what) {
    std::string key = k.entry + "\n" + k.source;
    auto it = functions_.find(key);
    if (it != functions_.end()) return it->second;
    TPC_ASSIGN(std::vector<char> cubin, compiler_->compile(k.source, k.entry));
    CUmodule mod;
    CUfunction fn;
    if (CUresult e = driver_->moduleLoadData(&mod, cubin.data()); e != CUDA_SUCCESS)
      return makeError("cuda: loading the cubin of kernel ", k.entry, " (", what, ") failed: ", driverError(e));
    if (CUresult e = driver_->moduleGetFunction(&fn, mod, k.entry.c_str()); e != CUDA_SUCCESS)
      return makeError("cuda: kernel ", k.entry, " (", what, ") is not in its source: ", driverError(e));
    functions_[key] = fn;
    return fn;
  }

  std::string driverError(CUresult e) const {
    const char* s = nullptr;
    driver_->getErrorString(e, &s);
    return s ? s : cat("CUresult ", int(e));
  }

  Status buildLaunches(size_t r, std::vector<NodeLowering>& lowerings, const std::vector<int>& matmulPlans,
                       const std::vector<PlannedBuffer>& plan, const std::vector<int>& workspaceOf,
                       const std::vector<std::pair<const Value*, std::string>>& paramCopies) {
    Rank& rk = ranks_[r];
    std::vector<Node*> nodes = rk.graph->nodeVector();
    rk.segments.emplace_back();
    for (size_t k = 0; k < nodes.size(); ++k) {
      const Node& n = *nodes[k];
      std::string what = cat(rankPrefix(r), n.opName(), " -> ", valueName(n.result()));
      switch (nodeExec(n)) {
        case NodeExec::Collective:
          rk.collectives.push_back(&n);
          rk.segments.emplace_back();
          continue;
        case NodeExec::Matmul: {
          for (const auto& [oa, ob, oc] : matmulCalls[r][k]) {
            Launch l;
            l.kind = Launch::Matmul;
            l.matmul = matmulPlans[k];
            l.a = static_cast<const char*>(rk.addr[n.operand(0)]) + oa * dtypeSize(n.operand(0)->dtype());
            l.b = static_cast<const char*>(rk.addr[n.operand(1)]) + ob * dtypeSize(n.operand(1)->dtype());
            l.c = static_cast<char*>(rk.addr[n.result()]) + oc * dtypeSize(n.result()->dtype());
            l.what = what;
            rk.segments.back().push_back(l);
          }
          continue;
        }
        case NodeExec::Kernels: break;
      }
      NodeLowering& nl = lowerings[k];
      char* ws = workspaceOf[k] >= 0 ? static_cast<char*>(rk.arena) + plan[workspaceOf[k]].offset : nullptr;
      if (ws && nl.zeroWorkspace) {
        Launch l;
        l.kind = Launch::Memset;
        l.c = ws;
        l.bytes = static_cast<size_t>(nl.workspaceBytes);
        l.what = what;
        rk.segments.back().push_back(l);
      }
      for (const KernelSpec& ks : nl.kernels) {
        Launch l;
        l.kind = Launch::Kernel;
        auto fn = function(ks, what);
        if (!fn.ok()) return Error{fn.error()};
        l.fn = *fn;
        l.grid = ks.grid;
        l.block = ks.block;
        l.smem = ks.sharedBytes;
        l.what = what + " [" + ks.entry + "]";
        if (ks.sharedBytes > 48 * 1024)
          if (CUresult e = driver_->funcSetAttribute(l.fn, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                                     static_cast<int>(ks.sharedBytes));
              e != CUDA_SUCCESS)
            return makeError("cuda: ", l.what, ": cannot use ", ks.sharedBytes, " bytes of shared memory: ", driverError(e));
        for (const KernelArg& a : ks.args) {
          uint64_t v = 0;
          switch (a.kind) {
            case ArgKind::Operand:
              if (a.index < 0 || a.index >= n.numOperands()) return makeError("cuda: ", l.what, ": bad operand index ", a.index);
              v = reinterpret_cast<uint64_t>(rk.addr[n.operand(static_cast<unsigned>(a.index))]);
              break;
            case ArgKind::Result:
              if (a.index < 0 || a.index >= n.numResults()) return makeError("cuda: ", l.what, ": bad result index ", a.index);
              v = reinterpret_cast<uint64_t>(rk.addr[n.result(static_cast<unsigned>(a.index))]);
              break;
            case ArgKind::Workspace: v = reinterpret_cast<uint64_t>(ws + a.index); break;
            case ArgKind::Int64: v = static_cast<uint64_t>(a.i); break;
            case ArgKind::Float: {
              float f = static_cast<float>(a.f);
              std::memcpy(&v, &f, sizeof f);
              break;
            }
            case ArgKind::Seed: v = options_.seed; break;
            case ArgKind::StepPtr: v = reinterpret_cast<uint64_t>(stepWord_); break;
          }
          l.argv.push_back(v);
        }
        rk.segments.back().push_back(std::move(l));
      }
    }
    for (const auto& [v, name] : paramCopies) {
      Launch l;
      l.kind = Launch::Copy;
      l.c = rk.params[name].second;
      l.a = rk.addr[v];
      l.bytes = static_cast<size_t>(v->type().bytes());
      l.what = cat(rankPrefix(r), "update of %", name);
      rk.segments.back().push_back(l);
    }
    return {};
  }

  // All ranks' launches in one order: segment s of every rank, then collective s across the ranks.
  Status assemble() {
    launches_.clear();
    size_t segs = ranks_[0].segments.size();
    for (size_t r = 1; r < ranks_.size(); ++r)
      if (ranks_[r].segments.size() != segs)
        return makeError("cuda backend: rank ", r, " has ", ranks_[r].collectives.size(), " collectives, rank 0 ",
                         ranks_[0].collectives.size(), " (the rank graphs are inconsistent)");
    const Mesh& mesh = ranks_[0].graph->mesh();
    for (size_t s = 0; s < segs; ++s) {
      for (auto& rk : ranks_)
        for (auto& l : rk.segments[s]) launches_.push_back(l);
      if (s + 1 < segs) TPC_TRY(collective(s, mesh));
    }
    launchCount_ = static_cast<int64_t>(launches_.size());
    return {};
  }

  Status collective(size_t s, const Mesh& mesh) {
    const Node& n0 = *ranks_[0].collectives[s];
    const std::string& axis = n0.getStr("axis");
    int ai = mesh.axisIndex(axis);
    int64_t G = mesh.axisSize(axis);
    for (size_t r = 1; r < ranks_.size(); ++r) {
      const Node& n = *ranks_[r].collectives[s];
      if (n.op() != n0.op() || n.getStr("axis") != axis || n.operand(0)->type() != n0.operand(0)->type())
        return makeError("cuda backend: collective ", s, " differs between rank 0 (", n0.opName(), " over ", axis,
                         ") and rank ", r, " (", n.opName(), " over ", n.getStr("axis"), ")");
    }
    // Row-major rank numbering over the mesh axes (the last fastest): the stride of axis ai.
    int64_t stride = 1;
    for (size_t a = mesh.axes.size(); a-- > static_cast<size_t>(ai) + 1;) stride *= mesh.axes[a].size;
    std::string what = cat(n0.opName(), " over ", axis, " -> ", valueName(n0.result()));
    for (size_t r = 0; r < ranks_.size(); ++r) {
      int64_t coord = (static_cast<int64_t>(r) / stride) % G;
      if (coord != 0) continue;  // each group once, from its first member
      std::vector<size_t> members;
      for (int64_t q = 0; q < G; ++q) members.push_back(r + q * stride);
      auto in = [&](size_t q) { return reinterpret_cast<uint64_t>(ranks_[members[q]].addr[ranks_[members[q]].collectives[s]->operand(0)]); };
      auto out = [&](size_t q) { return reinterpret_cast<uint64_t>(ranks_[members[q]].addr[ranks_[members[q]].collectives[s]->result()]); };
      DType t = n0.result()->dtype();
      bool max = n0.op() != OpKind::AllGather && n0.getStr("op") == "max";
      std::vector<std::pair<KernelSpec, std::vector<uint64_t>>> ks;
      if (n0.op() == OpKind::AllReduce) {
        std::vector<uint64_t> ptrs;
        for (int64_t q = 0; q < G; ++q) ptrs.push_back(in(q));
        for (int64_t q = 0; q < G; ++q) ptrs.push_back(out(q));
        ks.push_back({virtualAllReduce(t, static_cast<int>(G), max, n0.result()->type().numel()), ptrs});
      } else if (n0.op() == OpKind::ReduceScatter) {
        TPC_ASSIGN(int64_t dim, normalizeDim(n0.getInt("dim"), n0.operand(0)->type().rank()));
        for (int64_t q = 0; q < G; ++q) {
          std::vector<uint64_t> ptrs;
          for (int64_t p = 0; p < G; ++p) ptrs.push_back(in(p));
          ptrs.push_back(out(q));
          ks.push_back({virtualReduceScatter(t, static_cast<int>(G), max, n0.operand(0)->shape(), dim, static_cast<int>(q)), ptrs});
        }
      } else if (n0.op() == OpKind::AllGather) {
        TPC_ASSIGN(int64_t dim, normalizeDim(n0.getInt("dim"), n0.operand(0)->type().rank()));
        for (int64_t dst = 0; dst < G; ++dst)
          for (int64_t q = 0; q < G; ++q)
            ks.push_back({virtualAllGatherPiece(t, n0.operand(0)->shape(), n0.result()->shape(), dim, static_cast<int>(q)),
                          {out(dst), in(q)}});
      } else {
        return makeError("cuda backend: no virtual-rank lowering for collective ", n0.opName());
      }
      for (auto& [k, ptrs] : ks) {
        Launch l;
        l.kind = Launch::Kernel;
        TPC_ASSIGN(l.fn, function(k, what));
        l.grid = k.grid;
        l.block = k.block;
        l.what = what;
        for (size_t i = 0; i < k.args.size(); ++i) l.argv.push_back(i < ptrs.size() ? ptrs[i] : static_cast<uint64_t>(k.args[i].i));
        launches_.push_back(std::move(l));
      }
    }
    return {};
  }

  static Result<int64_t> normalizeDim(int64_t d, int64_t rank) {
    if (d < 0) d += rank;
    if (d < 0 || d >= rank) return makeError("cuda backend: collective dim ", d, " out of range for rank ", rank);
    return d;
  }

  Status enqueue(const Launch& l) {
    switch (l.kind) {
      case Launch::Kernel: {
        std::vector<void*> params;
        for (const uint64_t& v : l.argv) params.push_back(const_cast<uint64_t*>(&v));
        CUresult e = driver_->launchKernel(l.fn, l.grid.x, l.grid.y, l.grid.z, l.block.x, l.block.y, l.block.z, l.smem,
                                           reinterpret_cast<CUstream>(stream_), params.data(), nullptr);
        if (e != CUDA_SUCCESS) return makeError("cuda: launching ", l.what, ": ", driverError(e));
        return {};
      }
      case Launch::Matmul: return matmul_->run(l.matmul, l.a, l.b, l.c, matmulWorkspace_, stream_);
      case Launch::Memset: CU_TRY(cudaMemsetAsync(l.c, 0, l.bytes, stream_), l.what, " (zeroing its workspace)"); return {};
      case Launch::Copy: CU_TRY(cudaMemcpyAsync(l.c, l.a, l.bytes, cudaMemcpyDeviceToDevice, stream_), l.what); return {};
    }
    return {};
  }

  Status enqueueAll(bool syncEach, int64_t stepIndex) {
    for (const Launch& l : launches_) {
      TPC_TRY(enqueue(l));
      if (syncEach) {
        cudaError_t e = cudaStreamSynchronize(stream_);
        if (e != cudaSuccess) return makeError("cuda: step ", stepIndex, ": ", l.what, " failed: ", cudaGetErrorString(e));
      }
    }
    return {};
  }

  Status capture() {
    CU_TRY(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal), "beginning the graph capture");
    Status s = enqueueAll(false, 0);
    cudaGraph_t graph = nullptr;
    cudaError_t e = cudaStreamEndCapture(stream_, &graph);
    TPC_TRY(s);
    CU_TRY(e, "capturing the step as a CUDA graph");
    graph_ = graph;
    CU_TRY(cudaGraphInstantiate(&graphExec_, graph_, 0), "instantiating the step graph");
    return {};
  }

  void release() {
    if (graphExec_) cudaGraphExecDestroy(graphExec_);
    if (graph_) cudaGraphDestroy(graph_);
    graphExec_ = nullptr;
    graph_ = nullptr;
    for (auto& rk : ranks_) {
      for (void* p : rk.allocations) cudaFree(p);
      rk.allocations.clear();
      rk.addr.clear();
      rk.params.clear();
      rk.segments.clear();
      rk.collectives.clear();
      rk.arenaBytes = rk.stateBytes = rk.inputBytes = 0;
    }
    if (stepWord_) cudaFree(stepWord_);
    if (matmulWorkspace_) cudaFree(matmulWorkspace_);
    if (stream_) cudaStreamDestroy(stream_);
    stepWord_ = matmulWorkspace_ = nullptr;
    stream_ = nullptr;
    inPlace_.clear();
    launches_.clear();
    prepared_ = false;
  }

  CudaOptions options_;
  std::vector<Rank> ranks_;
  std::vector<llvm::DenseMap<const Value*, std::string>> inPlace_;
  std::vector<std::vector<std::vector<std::array<int64_t, 3>>>> matmulCalls;  // rank -> node -> calls
  LoweringContext ctx_;
  std::string deviceName_ = "GPU";
  const Driver* driver_ = nullptr;
  std::unique_ptr<NvrtcCompiler> compiler_;
  std::unique_ptr<CublasLtMatmul> matmul_;
  std::unordered_map<std::string, CUfunction> functions_;
  cudaStream_t stream_ = nullptr;
  void* stepWord_ = nullptr;
  void* matmulWorkspace_ = nullptr;
  int64_t stepHost_ = 0;
  std::vector<HostTensor> staging_;
  std::vector<Launch> launches_;
  int64_t launchCount_ = 0;
  cudaGraph_t graph_ = nullptr;
  cudaGraphExec_t graphExec_ = nullptr;
  bool prepared_ = false, debug_ = false;
};

}  // namespace

std::unique_ptr<Backend> createCudaBackend(std::vector<std::unique_ptr<Graph>> rankGraphs, CudaOptions options) {
  return std::make_unique<CudaBackend>(std::move(rankGraphs), std::move(options));
}

}  // namespace tpc
