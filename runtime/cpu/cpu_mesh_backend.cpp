// CpuMeshBackend: per-rank state and executors, a thread per rank for each step, slicing of the unsharded
// state and batch per placement, gathering of parameters, and the checks on replicated outputs.
#include "runtime/cpu/cpu_mesh_backend.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <mutex>
#include <thread>

#include "runtime/cpu/communicator.h"
#include "runtime/cpu/shared_memory_communicator.h"
#include "runtime/memory_estimate.h"

namespace tpc {
namespace {

std::string placeStr(const std::optional<Placement>& p) { return p ? p->str() : "[]"; }

// Copies the block at `offsets` of shape `local` between a global tensor and a local one (bytes).
void copyBlock(uint8_t* g, llvm::ArrayRef<int64_t> gShape, uint8_t* l, llvm::ArrayRef<int64_t> lShape,
               llvm::ArrayRef<int64_t> offsets, size_t elemSize, bool toLocal) {
  size_t r = lShape.size();
  if (r == 0) {
    if (toLocal) std::memcpy(l, g, elemSize);
    else std::memcpy(g, l, elemSize);
    return;
  }
  int64_t inner = lShape[r - 1], rows = 1;
  for (size_t k = 0; k + 1 < r; ++k) rows *= lShape[k];
  if (inner == 0 || rows == 0) return;
  std::vector<int64_t> gs(r);
  int64_t acc = 1;
  for (size_t k = r; k-- > 0;) {
    gs[k] = acc;
    acc *= gShape[k];
  }
  for (int64_t row = 0; row < rows; ++row) {
    int64_t go = offsets[r - 1], rem = row;
    for (size_t k = r - 1; k-- > 0;) {
      go += (offsets[k] + rem % lShape[k]) * gs[k];
      rem /= lShape[k];
    }
    uint8_t* gp = g + go * elemSize;
    uint8_t* lp = l + row * inner * elemSize;
    if (toLocal) std::memcpy(lp, gp, inner * elemSize);
    else std::memcpy(gp, lp, inner * elemSize);
  }
}

class CpuMeshBackend final : public Backend {
 public:
  CpuMeshBackend(std::vector<std::unique_ptr<Graph>> graphs, CpuOptions options, CpuMeshOptions meshOptions)
      : options_(std::move(options)), meshOptions_(meshOptions) {
    options_.communicator = nullptr;
    for (auto& g : graphs) ranks_.push_back(Rank{std::move(g), nullptr, {}, nullptr});
    init_ = check();
    if (init_.ok() && meshOptions_.localRank >= 0) {
      if (meshOptions_.localRank >= static_cast<int64_t>(ranks_.size()) || !meshOptions_.communicator ||
          !meshOptions_.allGatherWorld)
        init_ = makeError("cpu mesh backend: rank ", meshOptions_.localRank, " of ", ranks_.size(),
                          " alone needs its communicator and the world's all-gather");
      else
        ranks_[static_cast<size_t>(meshOptions_.localRank)].comm = meshOptions_.communicator;
    } else if (init_.ok()) {
      auto comms = cpu::createMeshCommunicators(mesh(), meshOptions_.collectiveTimeout);
      for (size_t r = 0; r < ranks_.size(); ++r) ranks_[r].comm = comms[r];
    }
  }

  std::string name() const override {
    // The mesh itself is the step graph's, printed beside the backend by `tpc run`.
    return cat(options_.fp64 ? "cpu-fp64" : "cpu", ranks_.empty() ? "" : cat(" (", ranks_.size(), " ranks)"),
               meshOptions_.localRank >= 0 ? cat(", this process runs rank ", meshOptions_.localRank) : "");
  }

  Status prepare(const Graph&, const TensorMap& initialState) override {
    TPC_TRY(init_);
    prepared_ = false;  // until every rank has its state and executor
    DType floatType = options_.fp64 ? DType::f64 : DType::f32;
    int total = options_.threads > 0 ? options_.threads : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    CpuOptions rankOptions = options_;
    rankOptions.threads = std::max(1, total / static_cast<int>(local().size()));
    // Every rank this process runs holds its state and activations in this process's memory (a previous
    // prepare's let go first).
    for (size_t r : local()) ranks_[r].exec.reset(), ranks_[r].state.clear();
    MemoryEstimate need;
    for (size_t r : local()) need += estimateMemory(*ranks_[r].graph, static_cast<int>(dtypeSize(floatType)));
    const int64_t limit = hostMemoryLimit(options_.hostMemoryLimit);
    TPC_TRY(checkHostMemory(need, limit, "cpu mesh backend", static_cast<int64_t>(local().size())));
    for (size_t r : local()) {
      Rank& rk = ranks_[r];
      for (Value* p : rk.graph->params()) {
        auto it = initialState.find(p->name());
        if (it == initialState.end())
          return makeError("cpu mesh backend: no initial value for parameter %", p->name(), " of graph @",
                           rk.graph->name());
        HostTensor t = isFloat(p->dtype()) ? it->second.convertTo(floatType) : it->second;
        auto local = sliceForRank(t, p->placement(), mesh(), static_cast<int64_t>(r));
        if (!local.ok()) return makeError("cpu mesh backend: parameter %", p->name(), ": ", local.error());
        if (local->shape() != p->shape())
          return makeError("cpu mesh backend: parameter %", p->name(), " of ", cpu::rankName(mesh(), r), " is ",
                           p->type().str(), " locally, but its block of the given ", it->second.type().str(), " under ",
                           placeStr(p->placement()), " is ", shapeStr(local->shape()));
        rk.state[p->name()] = local->clone();
      }
      rankOptions.communicator = rk.comm;
      auto exec = CpuExecutor::create(*rk.graph, rankOptions);
      if (!exec.ok()) return makeError(cpu::rankName(mesh(), r), ": ", exec.error());
      rk.exec = std::move(exec).value();
    }
    prepared_ = true;
    return {};
  }

  Result<TensorMap> step(const TensorMap& inputs, int64_t stepIndex) override {
    TPC_ASSIGN(std::vector<std::vector<HostTensor>> outs, runRanks(inputs, stepIndex));
    TensorMap result;
    std::vector<size_t> updates;
    const size_t lead = local()[0];  // the rank whose replicated outputs are returned
    const Graph& g0 = *ranks_[lead].graph;
    for (size_t i = 0; i < g0.outputs().size(); ++i) {
      std::string name = g0.outputName(i);
      if (ranks_[lead].state.count(name)) {
        updates.push_back(i);
        continue;
      }
      const Value* v = g0.outputs()[i].value;
      if (v->placement())
        for (const MeshAxis& a : mesh().axes)
          if (!v->placement()->get(a.name).isR())
            return makeError("cpu mesh backend: output %", name, " is ", v->placement()->str(),
                             ": only replicated outputs (R on every mesh axis) can be returned; all_reduce or "
                             "all_gather it in the graph");
      if (meshOptions_.checkReplicatedOutputs)
        for (size_t r : local()) {
          const HostTensor &a = outs[lead][i], &b = outs[r][i];
          if (a.type() != b.type() || a.bytes() != b.bytes() || std::memcmp(a.raw(), b.raw(), a.bytes()) != 0)
            return makeError("cpu mesh backend: replicated output %", name, " differs between ",
                             cpu::rankName(mesh(), 0), " and ", cpu::rankName(mesh(), r), " at step ", stepIndex,
                             " (the per-rank graphs are inconsistent)");
        }
      result[name] = std::move(outs[lead][i]);
    }
    // A non-finite step leaves every rank's state as it was (backend.h); loss and grad_norm are replicated,
    // so rank 0's outputs decide for all.
    if (isNonFiniteStep(result)) return result;
    for (size_t i : updates)
      for (size_t r : local()) ranks_[r].state[g0.outputName(i)] = std::move(outs[r][i]);
    return result;
  }

  Result<std::optional<NonFiniteValue>> findFirstNonFinite(const TensorMap& inputs, int64_t stepIndex) override {
    if (!prepared_) return makeError("cpu mesh backend: findFirstNonFinite() before a successful prepare()");
    for (size_t r : local()) ranks_[r].exec->setFiniteCheck(true);
    auto outs = runRanks(inputs, stepIndex);
    for (size_t r : local()) ranks_[r].exec->setFiniteCheck(false);
    if (!outs.ok()) return Error{outs.error()};
    // The earliest in execution order, then the lowest rank (of this process's ranks).
    std::optional<NonFiniteValue> first;
    for (size_t r : local()) {
      std::optional<NonFiniteValue> f = ranks_[r].exec->firstNonFinite();
      if (!f) continue;
      f->rank = static_cast<int64_t>(r);
      if (!first || f->index < first->index) first = std::move(f);
    }
    if (meshOptions_.localRank >= 0)
      return firstNonFiniteOfJob(first, static_cast<int64_t>(ranks_.size()), meshOptions_.allGatherWorld);
    return first;
  }

  // Runs the step on every rank (a thread each) and returns every rank's outputs; commits nothing.
  Result<std::vector<std::vector<HostTensor>>> runRanks(const TensorMap& inputs, int64_t stepIndex) {
    if (!prepared_) return makeError("cpu mesh backend: step() before a successful prepare()");
    DType floatType = options_.fp64 ? DType::f64 : DType::f32;
    size_t n = ranks_.size();
    // Each rank's inputs, sliced.
    std::vector<std::vector<HostTensor>> rankInputs(n);
    for (size_t r : local()) {
      for (Value* v : ranks_[r].graph->inputs()) {
        auto it = inputs.find(v->name());
        if (it == inputs.end()) return makeError("cpu mesh backend: missing input %", v->name());
        HostTensor t = isFloat(it->second.dtype()) && it->second.dtype() != floatType ? it->second.convertTo(floatType)
                                                                                      : it->second;
        auto local = sliceForRank(t, v->placement(), mesh(), static_cast<int64_t>(r));
        if (!local.ok()) return makeError("cpu mesh backend: input %", v->name(), ": ", local.error());
        if (local->shape() != v->shape())
          return makeError("cpu mesh backend: input %", v->name(), " must be ", globalShapeStr(*v), " (",
                           placeStr(v->placement()), " of local ", v->type().str(), "), got ", it->second.type().str());
        rankInputs[r].push_back(std::move(local).value());
      }
    }

    const size_t lead = local()[0];
    ranks_[lead].comm->reset();
    std::vector<std::optional<std::vector<HostTensor>>> outs(n);
    std::vector<std::string> errors(n);
    auto runRank = [&](size_t r) {
      Rank& rk = ranks_[r];
      std::vector<const HostTensor*> in, params;
      for (HostTensor& t : rankInputs[r]) in.push_back(&t);
      for (Value* p : rk.graph->params()) params.push_back(&rk.state.at(p->name()));
      auto res = rk.exec->run(in, params, stepIndex);
      if (res.ok()) {
        outs[r] = std::move(res).value();
        return;
      }
      // A collective's own errors already name the rank; anything else gets its name here.
      errors[r] = res.error().rfind("rank ", 0) == 0 ? res.error() : cat(cpu::rankName(mesh(), r), ": ", res.error());
      rk.comm->abort(errors[r]);  // release the ranks waiting for this one
    };
    std::vector<std::thread> threads;
    for (size_t r : local())
      if (r != lead) threads.emplace_back(runRank, r);
    runRank(lead);
    for (auto& t : threads) t.join();
    if (auto root = ranks_[lead].comm->abortReason()) {
      ranks_[lead].comm->reset();
      return Error{*root};
    }
    for (size_t r : local())
      if (!errors[r].empty()) return Error{errors[r]};
    std::vector<std::vector<HostTensor>> all(n);  // empty for the ranks other processes run
    for (size_t r : local()) all[r] = std::move(*outs[r]);
    return all;
  }

  // Each local rank's block of the unsharded `value` (as readState gives it; the same elements in another
  // shape are taken in this graph's global shape), converted to the rank's dtype.
  Status writeState(const std::string& name, const HostTensor& value) override {
    if (!prepared_ || !ranks_[local()[0]].state.count(name))
      return makeError("cpu mesh backend: no state tensor named '", name, "'");
    for (size_t r : local()) {
      Rank& rk = ranks_[r];
      const Value* p = nullptr;
      for (Value* v : rk.graph->params())
        if (v->name() == name) p = v;
      HostTensor& held = rk.state.at(name);
      TPC_ASSIGN(Shape gshape, globalShape(p->shape(), p->placement(), mesh()));
      TensorType globalType(value.dtype(), gshape);
      if (value.numel() != globalType.numel())
        return makeError("cpu mesh backend: state tensor '", name, "' is ", globalType.str(), " unsharded, cannot take ",
                         value.type().str());
      HostTensor whole(globalType);
      std::memcpy(whole.raw(), value.raw(), value.bytes());
      TPC_ASSIGN(HostTensor block, sliceForRank(whole, p->placement(), mesh(), static_cast<int64_t>(r)));
      HostTensor converted = block.convertTo(held.dtype());
      std::memcpy(held.raw(), converted.raw(), held.bytes());  // in place: the executor may hold the buffer
    }
    return {};
  }

  Result<HostTensor> readState(const std::string& name) const override {
    if (ranks_.empty() || !ranks_[local()[0]].state.count(name))
      return makeError("cpu mesh backend: no state tensor named '", name, "'");
    const Value* p = nullptr;
    for (Value* v : ranks_[0].graph->params())
      if (v->name() == name) p = v;
    const HostTensor& l0 = ranks_[local()[0]].state.at(name);
    // One rank per process: every rank's block (of one shape under even splits) from every process.
    std::vector<HostTensor> gathered;
    if (meshOptions_.localRank >= 0) {
      TPC_ASSIGN(gathered, gatherRankBlocks(l0, static_cast<int64_t>(ranks_.size()), meshOptions_.allGatherWorld));
    }
    auto stateOf = [&](size_t r) -> const HostTensor& { return gathered.empty() ? ranks_[r].state.at(name) : gathered[r]; };
    TPC_ASSIGN(Shape gshape, globalShape(l0.shape(), p->placement(), mesh()));
    HostTensor global(TensorType(l0.dtype(), gshape));
    std::map<std::vector<int64_t>, size_t> holder;  // block offsets -> the first rank holding that block
    for (size_t r = 0; r < ranks_.size(); ++r) {
      const Value* pr = nullptr;
      for (Value* v : ranks_[r].graph->params())
        if (v->name() == name) pr = v;
      const HostTensor& local = stateOf(r);
      // Ranks holding the same block (replicated over an axis) must agree bit for bit: one rank's copy
      // drifting from the others' (a replicated param updated from grads that differ) is a sharding bug.
      TPC_ASSIGN(ShardBlock b, shardBlock(gshape, pr->placement(), mesh(), static_cast<int64_t>(r)));
      std::vector<int64_t> key(b.offsets.begin(), b.offsets.end());
      if (auto it = holder.find(key); it != holder.end()) {
        const HostTensor& first = stateOf(it->second);
        if (first.bytes() != local.bytes() || std::memcmp(first.raw(), local.raw(), local.bytes()) != 0)
          return makeError("cpu mesh backend: state %", name, " is replicated between ", cpu::rankName(mesh(), it->second),
                           " and ", cpu::rankName(mesh(), r), " but their copies differ");
        continue;
      }
      holder[key] = r;
      TPC_TRY(placeIntoGlobal(local, pr->placement(), mesh(), static_cast<int64_t>(r), global));
    }
    return global;
  }

 private:
  struct Rank {
    std::unique_ptr<Graph> graph;
    std::unique_ptr<CpuExecutor> exec;
    TensorMap state;
    std::shared_ptr<cpu::Communicator> comm;
  };

  const Mesh& mesh() const { return ranks_[0].graph->mesh(); }
  // The ranks this process runs: all of them, or meshOptions_.localRank alone.
  std::vector<size_t> local() const {
    if (meshOptions_.localRank >= 0) return {static_cast<size_t>(meshOptions_.localRank)};
    std::vector<size_t> all(ranks_.size());
    for (size_t r = 0; r < all.size(); ++r) all[r] = r;
    return all;
  }

  std::string globalShapeStr(const Value& v) const {
    auto s = globalShape(v.shape(), v.placement(), mesh());
    return s.ok() ? TensorType(v.dtype(), *s).str() : v.type().str();
  }

  Status check() const {
    if (ranks_.empty()) return makeError("cpu mesh backend: no rank graphs");
    const Graph& g0 = *ranks_[0].graph;
    int64_t want = g0.mesh().numRanks();
    if (static_cast<int64_t>(ranks_.size()) != want)
      return makeError("cpu mesh backend: ", g0.mesh().str(), " has ", want, " ranks, but ", ranks_.size(),
                       " rank graphs were given");
    for (size_t r = 1; r < ranks_.size(); ++r) {
      const Graph& g = *ranks_[r].graph;
      if (!(g.mesh() == g0.mesh()))
        return makeError("cpu mesh backend: rank ", r, "'s graph has ", g.mesh().str(), ", rank 0's ", g0.mesh().str());
      if (g.params().size() != g0.params().size() || g.outputs().size() != g0.outputs().size())
        return makeError("cpu mesh backend: rank ", r, "'s graph has ", g.params().size(), " params and ",
                         g.outputs().size(), " outputs, rank 0's ", g0.params().size(), " and ", g0.outputs().size());
      for (size_t k = 0; k < g.params().size(); ++k)
        if (g.params()[k]->name() != g0.params()[k]->name())
          return makeError("cpu mesh backend: rank ", r, "'s parameter ", k, " is %", g.params()[k]->name(),
                           ", rank 0's %", g0.params()[k]->name());
      for (size_t k = 0; k < g.outputs().size(); ++k)
        if (g.outputName(k) != g0.outputName(k))
          return makeError("cpu mesh backend: rank ", r, "'s output ", k, " is %", g.outputName(k), ", rank 0's %",
                           g0.outputName(k));
    }
    return {};
  }

  CpuOptions options_;
  CpuMeshOptions meshOptions_;
  std::vector<Rank> ranks_;
  Status init_;
  bool prepared_ = false;
};

}  // namespace

Result<ShardBlock> shardBlock(llvm::ArrayRef<int64_t> global, const std::optional<Placement>& placement,
                              const Mesh& mesh, int64_t rank) {
  ShardBlock b;
  b.offsets.assign(global.size(), 0);
  b.shape.assign(global.begin(), global.end());
  if (!placement) return b;
  std::vector<int64_t> coords = cpu::meshCoords(mesh, rank);
  for (size_t a = 0; a < mesh.axes.size(); ++a) {
    AxisPlacement ap = placement->get(mesh.axes[a].name);
    if (ap.isR()) continue;
    if (ap.isP())
      return makeError("placement ", placement->str(), " is partial (P) on axis '", mesh.axes[a].name,
                       "': inputs and parameters must be R or S(d)");
    int64_t d = ap.dim < 0 ? ap.dim + static_cast<int64_t>(global.size()) : ap.dim;
    if (d < 0 || d >= static_cast<int64_t>(global.size()))
      return makeError("placement ", placement->str(), " splits dim ", ap.dim, " of a rank-", global.size(), " tensor");
    int64_t n = mesh.axes[a].size;
    if (b.shape[d] % n != 0)
      return makeError("placement ", placement->str(), ": dim ", d, " of ", shapeStr(global), " (block ", b.shape[d],
                       ") does not split evenly over ", mesh.axes[a].name, "=", n);
    b.shape[d] /= n;
    b.offsets[d] += coords[a] * b.shape[d];
  }
  return b;
}

Result<Shape> globalShape(llvm::ArrayRef<int64_t> local, const std::optional<Placement>& placement, const Mesh& mesh) {
  Shape g(local.begin(), local.end());
  if (!placement) return g;
  for (const MeshAxis& a : mesh.axes) {
    AxisPlacement ap = placement->get(a.name);
    if (ap.isP()) return makeError("placement ", placement->str(), " is partial (P) on axis '", a.name, "'");
    if (!ap.isS()) continue;
    int64_t d = ap.dim < 0 ? ap.dim + static_cast<int64_t>(g.size()) : ap.dim;
    if (d < 0 || d >= static_cast<int64_t>(g.size()))
      return makeError("placement ", placement->str(), " splits dim ", ap.dim, " of a rank-", g.size(), " tensor");
    g[d] *= a.size;
  }
  return g;
}

Result<HostTensor> sliceForRank(const HostTensor& global, const std::optional<Placement>& placement, const Mesh& mesh,
                                int64_t rank) {
  TPC_ASSIGN(ShardBlock b, shardBlock(global.shape(), placement, mesh, rank));
  if (b.shape == global.shape()) return global;  // shares storage: the caller clones what it keeps
  HostTensor local(TensorType(global.dtype(), b.shape));
  copyBlock(const_cast<uint8_t*>(global.raw()), global.shape(), local.raw(), b.shape, b.offsets,
            static_cast<size_t>(dtypeSize(global.dtype())), true);
  return local;
}

Status placeIntoGlobal(const HostTensor& local, const std::optional<Placement>& placement, const Mesh& mesh,
                       int64_t rank, HostTensor& global) {
  TPC_ASSIGN(ShardBlock b, shardBlock(global.shape(), placement, mesh, rank));
  if (b.shape != local.shape() || local.dtype() != global.dtype())
    return makeError("rank ", rank, "'s ", local.type().str(), " is not its block ", shapeStr(b.shape), " of ",
                     global.type().str(), " under ", placeStr(placement));
  copyBlock(global.raw(), global.shape(), const_cast<uint8_t*>(local.raw()), b.shape, b.offsets,
            static_cast<size_t>(dtypeSize(global.dtype())), false);
  return {};
}

Result<std::vector<HostTensor>> gatherRankBlocks(const HostTensor& local, int64_t ranks, const AllGatherWorld& allGatherWorld) {
  if (!allGatherWorld) return makeError("gathering state across processes: no all-gather over the job's processes");
  const size_t bytes = local.bytes();
  std::vector<uint8_t> all(bytes * static_cast<size_t>(ranks));
  TPC_TRY(allGatherWorld(local.raw(), static_cast<int64_t>(bytes), all.data()));
  std::vector<HostTensor> blocks;
  for (int64_t r = 0; r < ranks; ++r) {
    HostTensor t(local.type());
    std::memcpy(t.raw(), all.data() + static_cast<size_t>(r) * bytes, bytes);
    blocks.push_back(std::move(t));
  }
  return blocks;
}

Result<std::optional<NonFiniteValue>> firstNonFiniteOfJob(const std::optional<NonFiniteValue>& mine, int64_t processes,
                                                          const AllGatherWorld& allGatherWorld) {
  if (!allGatherWorld) return makeError("finding the first non-finite value: no all-gather over the job's processes");
  // A fixed-size record per process: found, index, numNodes, rank, element, sample, then the two names (cut to
  // their slots).
  constexpr size_t kValue = 256, kNode = 2048, kHead = 5 * sizeof(int64_t) + sizeof(double), kRecord = kHead + kValue + kNode;
  std::vector<char> rec(kRecord, 0), all(kRecord * static_cast<size_t>(processes));
  if (mine) {
    int64_t head[5] = {1, mine->index, mine->numNodes, mine->rank, mine->element};
    std::memcpy(rec.data(), head, sizeof head);
    std::memcpy(rec.data() + sizeof head, &mine->sample, sizeof(double));
    std::memcpy(rec.data() + kHead, mine->value.data(), std::min(mine->value.size(), kValue - 1));
    std::memcpy(rec.data() + kHead + kValue, mine->node.data(), std::min(mine->node.size(), kNode - 1));
  }
  TPC_TRY(allGatherWorld(rec.data(), static_cast<int64_t>(kRecord), all.data()));
  std::optional<NonFiniteValue> first;
  for (int64_t p = 0; p < processes; ++p) {
    const char* r = all.data() + static_cast<size_t>(p) * kRecord;
    int64_t head[5];
    std::memcpy(head, r, sizeof head);
    if (!head[0]) continue;
    NonFiniteValue f;
    f.index = head[1], f.numNodes = head[2], f.rank = head[3], f.element = head[4];
    std::memcpy(&f.sample, r + sizeof head, sizeof(double));
    f.value = std::string(r + kHead);
    f.node = std::string(r + kHead + kValue);
    if (!first || f.index < first->index || (f.index == first->index && f.rank < first->rank)) first = std::move(f);
  }
  return first;
}

std::unique_ptr<Backend> createCpuMeshBackend(std::vector<std::unique_ptr<Graph>> rankGraphs, CpuOptions options,
                                              CpuMeshOptions meshOptions) {
  return std::make_unique<CpuMeshBackend>(std::move(rankGraphs), std::move(options), meshOptions);
}

}  // namespace tpc
