// The sharding equivalence tests (issue 5): a 2-layer GPT trained 3 steps under tp in {1,2,4,8}, sp on/off,
// dp in {1,2}, dp 2 x tp 4, dropout off/on gives the single-rank loss at every step and the single-rank
// updated parameters (gathered from the shards). Each rank runs its partitioned program on a thread, with
// an in-test shared-memory communicator.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <condition_variable>
#include <map>
#include <mutex>
#include <random>
#include <thread>

#include "models/gpt.h"
#include "passes/pipeline.h"
#include "passes/sharding/sharding.h"
#include "runtime/cpu/communicator.h"
#include "runtime/cpu/cpu_executor.h"
#include "runtime/param_init.h"

namespace tpc {
namespace {

// ---- an in-process communicator: one rendezvous per (axis, group of ranks that differ only on it) ----
struct Rendezvous {
  std::mutex m;
  std::condition_variable cv;
  int64_t size = 0, arrived = 0, departed = 0;
  bool draining = false;
  std::vector<std::vector<double>> data;

  std::vector<std::vector<double>> exchange(int64_t idx, std::vector<double> mine) {
    std::unique_lock l(m);
    cv.wait(l, [&] { return !draining; });
    data[idx] = std::move(mine);
    if (++arrived == size) {
      draining = true;
      cv.notify_all();
    } else {
      cv.wait(l, [&] { return draining; });
    }
    std::vector<std::vector<double>> all = data;
    if (++departed == size) {
      arrived = departed = 0;
      draining = false;
      cv.notify_all();
    }
    return all;
  }
};

struct Hub {
  Mesh mesh;
  std::map<std::pair<std::string, int64_t>, std::unique_ptr<Rendezvous>> groups;
  explicit Hub(Mesh m) : mesh(std::move(m)) {
    for (int64_t r = 0; r < std::max<int64_t>(1, mesh.numRanks()); ++r)
      for (const MeshAxis& a : mesh.axes) {
        auto key = std::make_pair(a.name, groupOf(r, a.name));
        if (!groups.count(key)) {
          groups[key] = std::make_unique<Rendezvous>();
          groups[key]->size = a.size;
          groups[key]->data.resize(a.size);
        }
      }
  }
  int64_t groupOf(int64_t rank, const std::string& axis) const {
    auto c = sharding::rankCoords(mesh, rank);
    c[mesh.axisIndex(axis)] = 0;
    int64_t g = 0;
    for (size_t k = 0; k < c.size(); ++k) g = g * mesh.axes[k].size + c[k];
    return g;
  }
};

class ThreadCommunicator final : public cpu::Communicator {
 public:
  ThreadCommunicator(Hub& hub, int64_t rank) : hub_(hub), rank_(rank) {}
  int64_t axisSize(const std::string& axis) const override { return hub_.mesh.axisSize(axis); }
  int64_t axisRank(const std::string& axis) const override {
    int i = hub_.mesh.axisIndex(axis);
    return i < 0 ? 0 : sharding::rankCoords(hub_.mesh, rank_)[i];
  }
  Status allReduce(const std::string& axis, cpu::ReduceOp op, float* d, int64_t n) override { return reduce(axis, op, d, n); }
  Status allReduce(const std::string& axis, cpu::ReduceOp op, double* d, int64_t n) override { return reduce(axis, op, d, n); }
  Status allGather(const std::string& axis, const float* in, int64_t n, float* out) override { return gather(axis, in, n, out); }
  Status allGather(const std::string& axis, const double* in, int64_t n, double* out) override { return gather(axis, in, n, out); }

 private:
  Rendezvous& group(const std::string& axis) { return *hub_.groups.at({axis, hub_.groupOf(rank_, axis)}); }
  template <class T>
  Status reduce(const std::string& axis, cpu::ReduceOp op, T* d, int64_t n) {
    auto all = group(axis).exchange(axisRank(axis), std::vector<double>(d, d + n));
    for (int64_t i = 0; i < n; ++i) {  // rank order, so every rank gets bit-identical sums
      double acc = all[0][i];
      for (size_t r = 1; r < all.size(); ++r) acc = op == cpu::ReduceOp::Max ? std::max(acc, all[r][i]) : acc + all[r][i];
      d[i] = static_cast<T>(acc);
    }
    return {};
  }
  template <class T>
  Status gather(const std::string& axis, const T* in, int64_t n, T* out) {
    auto all = group(axis).exchange(axisRank(axis), std::vector<double>(in, in + n));
    for (size_t r = 0; r < all.size(); ++r)
      for (int64_t i = 0; i < n; ++i) out[r * n + i] = static_cast<T>(all[r][i]);
    return {};
  }
  Hub& hub_;
  int64_t rank_;
};

// ---- slicing global tensors into shards and back ----
// Calls f(globalFlatIndex, localFlatIndex) for every element of rank's shard.
template <class F>
void forShard(const Shape& global, const Placement& p, const Mesh& mesh, int64_t rank, F f) {
  Shape local = sharding::localShape(global, p, mesh);
  std::vector<int64_t> off(global.size(), 0);
  auto coords = sharding::rankCoords(mesh, rank);
  for (size_t k = 0; k < mesh.axes.size(); ++k) {
    AxisPlacement ap = p.get(mesh.axes[k].name);
    if (ap.isS()) off[ap.dim] += coords[k] * local[ap.dim];
  }
  int64_t n = 1;
  for (int64_t s : local) n *= s;
  for (int64_t li = 0; li < n; ++li) {
    int64_t rem = li, gi = 0, stride = 1;
    for (size_t k = local.size(); k-- > 0;) {
      int64_t c = rem % local[k];
      rem /= local[k];
      gi += (c + off[k]) * stride;
      stride *= global[k];
    }
    f(gi, li);
  }
}

HostTensor shardOf(const HostTensor& g, const Value& globalV, const Value& localV, const Mesh& mesh, int64_t rank) {
  HostTensor t(localV.type());
  size_t es = static_cast<size_t>(dtypeSize(g.dtype()));
  forShard(globalV.shape(), globalV.placement().value_or(Placement{}), mesh, rank,
           [&](int64_t gi, int64_t li) { std::memcpy(t.raw() + li * es, g.raw() + gi * es, es); });
  return t;
}

struct Setup {
  int64_t tp = 1, dp = 1;
  bool sp = false, dropout = false;
};

GptConfig smallGpt(bool dropout) {
  GptConfig g;
  g.layers = 2;
  g.hidden = 64;
  g.heads = 8;
  g.vocab = 100;
  g.paddedVocab = 1024;  // a multiple of 128 x 8: every tp of the test splits it
  g.positions = 16;
  g.hiddenDropout = dropout ? 0.1 : 0.0;
  g.attentionDropout = dropout ? 0.1 : 0.0;
  return g;
}

TrainConfig smallTrain() {
  TrainConfig c;
  c.microBatch = 4;
  c.globalBatch = 4;
  c.seqLength = 16;
  return c;
}

std::string trainingPasses() { return "autodiff(clip-grad=1.0, weight-decay=0.1),cse,dce"; }

struct Trace {
  std::vector<double> losses, norms;
  std::map<std::string, std::vector<float>> params;
};

std::vector<TensorMap> batches(int64_t steps) {
  std::mt19937 rng(7);
  std::vector<TensorMap> out;
  for (int64_t s = 0; s < steps; ++s) {
    TensorMap m;
    for (const char* name : {"tokens", "targets"}) {
      HostTensor t(TensorType(DType::i32, {4, 16}));
      for (int64_t i = 0; i < t.numel(); ++i) t.data<int32_t>()[i] = static_cast<int32_t>(rng() % 100);
      m[name] = t;
    }
    m["lr"] = HostTensor::scalarF32(1e-3f);
    m["step"] = HostTensor::scalarF32(static_cast<float>(s + 1));
    out.push_back(m);
  }
  return out;
}

std::vector<float> floats(const HostTensor& t) { return std::vector<float>(t.data<float>(), t.data<float>() + t.numel()); }

// Runs `g` (global, annotated when sharded) for `steps` on its mesh, one thread per rank.
Trace train(const Graph& g, int64_t steps, uint64_t seed) {
  Mesh mesh = g.mesh();
  int64_t ranks = std::max<int64_t>(1, mesh.numRanks());
  std::vector<std::unique_ptr<Graph>> local(ranks);
  for (int64_t r = 0; r < ranks; ++r) {
    if (mesh.empty()) {
      local[r] = g.clone();
      continue;
    }
    auto l = partitionForRank(g, r);
    INFO(l.ok() ? std::string() : l.error());
    REQUIRE(l.ok());
    local[r] = std::move(*l);
  }
  Hub hub(mesh);
  std::vector<std::unique_ptr<CpuExecutor>> exec(ranks);
  std::vector<std::vector<HostTensor>> state(ranks);  // per rank, in params order
  for (int64_t r = 0; r < ranks; ++r) {
    CpuOptions o;
    o.threads = 1;
    o.seed = seed;
    if (!mesh.empty()) o.communicator = std::make_shared<ThreadCommunicator>(hub, r);
    auto e = CpuExecutor::create(*local[r], o);
    INFO(e.ok() ? std::string() : e.error());
    REQUIRE(e.ok());
    exec[r] = std::move(*e);
    for (size_t k = 0; k < g.params().size(); ++k) {
      HostTensor full = initParam(*g.params()[k], 1);
      state[r].push_back(mesh.empty() ? full : shardOf(full, *g.params()[k], *local[r]->params()[k], mesh, r));
    }
  }
  Trace trace;
  auto data = batches(steps);
  for (int64_t s = 0; s < steps; ++s) {
    std::vector<Result<std::vector<HostTensor>>> outs(ranks, std::vector<HostTensor>{});
    std::vector<std::thread> threads;
    for (int64_t r = 0; r < ranks; ++r)
      threads.emplace_back([&, r] {
        std::vector<HostTensor> ins;
        for (size_t k = 0; k < g.inputs().size(); ++k) {
          const HostTensor& full = data[s].at(g.inputs()[k]->name());
          ins.push_back(mesh.empty() ? full : shardOf(full, *g.inputs()[k], *local[r]->inputs()[k], mesh, r));
        }
        std::vector<const HostTensor*> ip, pp;
        for (auto& t : ins) ip.push_back(&t);
        for (auto& t : state[r]) pp.push_back(&t);
        outs[r] = exec[r]->run(ip, pp, s);
      });
    for (auto& t : threads) t.join();
    for (int64_t r = 0; r < ranks; ++r) {
      INFO("rank " << r << ": " << (outs[r].ok() ? std::string() : outs[r].error()));
      REQUIRE(outs[r].ok());
      const Graph& lg = *local[r];
      for (size_t i = 0; i < lg.outputs().size(); ++i) {
        std::string name = lg.outputName(i);
        if (name == "loss" && r == 0) trace.losses.push_back((*outs[r])[i].data<float>()[0]);
        if (name == "grad_norm" && r == 0) trace.norms.push_back((*outs[r])[i].data<float>()[0]);
        for (size_t k = 0; k < lg.params().size(); ++k)
          if (lg.params()[k]->name() == name) state[r][k] = (*outs[r])[i];
      }
    }
  }
  // Gather the params back into their global layout.
  for (size_t k = 0; k < g.params().size(); ++k) {
    const Value& p = *g.params()[k];
    std::vector<float> full(static_cast<size_t>(p.type().numel()));
    for (int64_t r = 0; r < ranks; ++r) {
      const float* d = state[r][k].data<float>();
      if (mesh.empty()) std::copy(d, d + p.type().numel(), full.begin());
      else forShard(p.shape(), p.placement().value_or(Placement{}), mesh, r, [&](int64_t gi, int64_t li) { full[gi] = d[li]; });
    }
    trace.params[p.name()] = full;
  }
  return trace;
}

std::unique_ptr<Graph> stepGraph(const Setup& s) {
  auto m = buildGpt(smallGpt(s.dropout), smallTrain());
  REQUIRE(m.ok());
  std::unique_ptr<Graph> g = std::move(m->forward);
  std::string passes;
  if (s.tp > 1 || s.sp) passes += "megatron-tp(tp=" + std::to_string(s.tp) + "),";
  if (s.sp) passes += "sequence-parallel,";
  passes += trainingPasses();
  if (s.dp > 1) passes += ",data-parallel(dp=" + std::to_string(s.dp) + ")";
  PassManager pm;
  Status st = pm.addPipeline(passes);
  INFO(st.ok() ? std::string() : st.error());
  REQUIRE(st.ok());
  st = pm.run(*g);
  INFO(st.ok() ? std::string() : st.error());
  REQUIRE(st.ok());
  if (!g->mesh().empty()) {
    st = propagatePlacements(*g);
    INFO(st.ok() ? std::string() : st.error());
    REQUIRE(st.ok());
  }
  return g;
}

double relErr(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num = std::max(num, std::abs(double(a[i]) - b[i]));
    den = std::max(den, std::abs(double(b[i])));
  }
  return num / std::max(den, 1e-30);
}

void checkEquivalent(const Setup& s) {
  const int64_t steps = 3;
  Trace ref = train(*stepGraph(Setup{1, 1, false, s.dropout}), steps, 99);
  Trace got = train(*stepGraph(s), steps, 99);
  REQUIRE(got.losses.size() == ref.losses.size());
  double worstLoss = 0, worstParam = 0;
  std::string worstName;
  for (size_t i = 0; i < ref.losses.size(); ++i) {
    worstLoss = std::max(worstLoss, std::abs(got.losses[i] - ref.losses[i]) / std::abs(ref.losses[i]));
    worstLoss = std::max(worstLoss, std::abs(got.norms[i] - ref.norms[i]) / std::abs(ref.norms[i]));
  }
  for (const auto& [name, v] : ref.params) {
    REQUIRE(got.params.count(name));
    double e = relErr(got.params.at(name), v);
    if (e > worstParam) worstParam = e, worstName = name;
  }
  WARN("tp=" << s.tp << " dp=" << s.dp << " sp=" << s.sp << " dropout=" << s.dropout << ": loss/grad-norm rel err "
             << worstLoss << ", worst param rel err " << worstParam << " (" << worstName << ")");
  CHECK(worstLoss <= 1e-5);
  CHECK(worstParam <= 1e-5);
}

}  // namespace

TEST_CASE("sharding equivalence: tp 1, 2, 4, 8 match one rank", "[sharding][equivalence]") {
  for (bool dropout : {false, true})
    for (int64_t tp : {1, 2, 4, 8}) checkEquivalent(Setup{tp, 1, false, dropout});
}

TEST_CASE("sharding equivalence: sequence parallel tp 2, 4 match one rank", "[sharding][equivalence]") {
  for (bool dropout : {false, true})
    for (int64_t tp : {2, 4}) checkEquivalent(Setup{tp, 1, true, dropout});
}

TEST_CASE("sharding equivalence: dp 2 and dp 2 x tp 4 match one rank", "[sharding][equivalence]") {
  for (bool dropout : {false, true}) {
    checkEquivalent(Setup{1, 2, false, dropout});
    checkEquivalent(Setup{4, 2, false, dropout});
    checkEquivalent(Setup{4, 2, true, dropout});
  }
}

}  // namespace tpc
