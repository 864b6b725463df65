// The CPU backend on a mesh: the shared-memory communicator (collectives on 2, 4, 8 ranks and a 2-D
// mesh, determinism, timeouts, aborts), dropout/attention on shards, and the mesh backend (state slicing,
// a hand-partitioned MLP, the tp=2 GPT block).
#include <atomic>
#include <chrono>
#include <cmath>
#include <functional>
#include <thread>

#include "cpu_test_helpers.h"
#include "ir/parser.h"
#include "runtime/cpu/cpu_backend.h"
#include "runtime/cpu/cpu_mesh_backend.h"
#include "runtime/cpu/shared_memory_communicator.h"
#include "test_support.h"

using namespace tpc;
using namespace tpc::test;
using cpu::Communicator;
using cpu::ReduceOp;

namespace {

Mesh makeMesh(std::vector<std::pair<std::string, int64_t>> axes) {
  Mesh m;
  for (auto& [n, s] : axes) m.axes.push_back({n, s});
  return m;
}

// Runs fn(rank) on one thread per rank; returns each rank's Status.
std::vector<Status> onEveryRank(int64_t ranks, const std::function<Status(int64_t)>& fn) {
  std::vector<Status> st(static_cast<size_t>(ranks));
  std::vector<std::thread> ts;
  for (int64_t r = 0; r < ranks; ++r) ts.emplace_back([&, r] { st[r] = fn(r); });
  for (auto& t : ts) t.join();
  return st;
}

// A value that differs per rank and element and does not sum exactly in float.
float valueOf(int64_t rank, int64_t i) { return std::sin(0.37f * static_cast<float>(i) + 1.3f * static_cast<float>(rank)) * 1.1f; }

// The ranks sharing every coordinate of `rank` but `axis`, in axis order.
std::vector<int64_t> groupOf(const Mesh& m, int64_t rank, int axis) {
  std::vector<int64_t> c = cpu::meshCoords(m, rank), g;
  for (int64_t k = 0; k < m.axes[axis].size; ++k) {
    c[axis] = k;
    g.push_back(cpu::meshRank(m, c));
  }
  return g;
}

// Every collective on every axis of `m`, checked against direct computation in rank order.
void checkCollectives(const Mesh& m) {
  auto comms = cpu::createMeshCommunicators(m, std::chrono::seconds(20));
  int64_t ranks = m.numRanks();
  REQUIRE(static_cast<int64_t>(comms.size()) == ranks);
  const int64_t n = 37;
  for (size_t a = 0; a < m.axes.size(); ++a) {
    const std::string& axis = m.axes[a].name;
    int64_t size = m.axes[a].size;
    std::vector<std::vector<float>> sum(ranks), mx(ranks), gathered(ranks), scattered(ranks);
    std::vector<std::vector<int64_t>> isum(ranks);
    auto st = onEveryRank(ranks, [&](int64_t r) -> Status {
      Communicator& c = *comms[r];
      std::vector<float> x(n);
      for (int64_t i = 0; i < n; ++i) x[i] = valueOf(r, i);
      sum[r] = x;
      TPC_TRY(c.allReduce(axis, ReduceOp::Sum, sum[r].data(), n));
      mx[r] = x;
      TPC_TRY(c.allReduce(axis, ReduceOp::Max, mx[r].data(), n));
      gathered[r].resize(n * size);
      TPC_TRY(c.allGather(axis, x.data(), n, gathered[r].data()));
      std::vector<float> big(n * size);
      for (int64_t i = 0; i < n * size; ++i) big[i] = valueOf(r, i + 1000);
      scattered[r].resize(n);
      TPC_TRY(c.reduceScatter(axis, ReduceOp::Sum, big.data(), n, scattered[r].data()));
      isum[r].assign(n, r * 1000);
      for (int64_t i = 0; i < n; ++i) isum[r][i] += i;
      return c.allReduce(axis, ReduceOp::Sum, isum[r].data(), n);
    });
    for (int64_t r = 0; r < ranks; ++r) {
      INFO("mesh " << m.str() << ", axis " << axis << ", rank " << r);
      REQUIRE(st[r].ok());
      CHECK(comms[r]->axisSize(axis) == size);
      std::vector<int64_t> g = groupOf(m, r, static_cast<int>(a));
      int64_t me = cpu::meshCoords(m, r)[a];
      CHECK(comms[r]->axisRank(axis) == me);
      for (int64_t i = 0; i < n; ++i) {
        float s = valueOf(g[0], i), x = valueOf(g[0], i), rs = valueOf(g[0], me * n + i + 1000);
        int64_t is = g[0] * 1000 + i;
        for (size_t k = 1; k < g.size(); ++k) {
          s += valueOf(g[k], i);
          x = std::max(x, valueOf(g[k], i));
          rs += valueOf(g[k], me * n + i + 1000);
          is += g[k] * 1000 + i;
        }
        REQUIRE(sum[r][i] == s);  // bit-identical: rank order
        REQUIRE(mx[r][i] == x);
        REQUIRE(scattered[r][i] == rs);
        REQUIRE(isum[r][i] == is);
        for (size_t k = 0; k < g.size(); ++k) REQUIRE(gathered[r][k * n + i] == valueOf(g[k], i));
      }
    }
  }
}

}  // namespace

TEST_CASE("mesh communicator: rank coordinates are row-major, the last axis fastest", "[cpu][mesh]") {
  Mesh m = makeMesh({{"dp", 2}, {"tp", 4}});
  CHECK(cpu::meshCoords(m, 6) == std::vector<int64_t>{1, 2});
  CHECK(cpu::meshRank(m, {1, 2}) == 6);
  CHECK(cpu::rankName(m, 5) == "rank 5 (dp=1, tp=1)");
  auto comms = cpu::createMeshCommunicators(m);
  CHECK(comms[6]->axisRank("dp") == 1);
  CHECK(comms[6]->axisRank("tp") == 2);
  CHECK(comms[6]->axisSize("pp") == 1);
  CHECK(comms[6]->axisRank("pp") == 0);
}

TEST_CASE("mesh communicator: collectives on 2, 4 and 8 ranks match direct sums", "[cpu][mesh]") {
  for (int64_t n : {2, 4, 8}) checkCollectives(makeMesh({{"tp", n}}));
}

TEST_CASE("mesh communicator: collectives on a 2-D mesh (dp=2, tp=4) run within each axis group", "[cpu][mesh]") {
  checkCollectives(makeMesh({{"dp", 2}, {"tp", 4}}));
}

TEST_CASE("mesh communicator: all_reduce is bit-identical across runs and ranks", "[cpu][mesh]") {
  Mesh m = makeMesh({{"tp", 8}});
  const int64_t n = 4096;
  std::vector<float> first;
  for (int run = 0; run < 5; ++run) {
    auto comms = cpu::createMeshCommunicators(m);
    std::vector<std::vector<float>> out(8);
    auto st = onEveryRank(8, [&](int64_t r) -> Status {
      // Stagger arrivals differently each run: the arrival order must not matter.
      std::this_thread::sleep_for(std::chrono::microseconds(((r * 7 + run * 3) % 8) * 200));
      out[r].resize(n);
      for (int64_t i = 0; i < n; ++i) out[r][i] = valueOf(r, i) * 1e3f + 1e-3f * static_cast<float>(i);
      return comms[r]->allReduce("tp", ReduceOp::Sum, out[r].data(), n);
    });
    for (auto& s : st) REQUIRE(s.ok());
    for (int r = 1; r < 8; ++r) REQUIRE(std::memcmp(out[r].data(), out[0].data(), n * sizeof(float)) == 0);
    if (run == 0) first = out[0];
    else REQUIRE(std::memcmp(out[0].data(), first.data(), n * sizeof(float)) == 0);
  }
}

TEST_CASE("mesh communicator: thousands of back-to-back collectives on both axes of a 2-D mesh stay in step", "[cpu][mesh]") {
  Mesh m = makeMesh({{"dp", 2}, {"tp", 4}});
  auto comms = cpu::createMeshCommunicators(m, std::chrono::seconds(20));
  auto st = onEveryRank(8, [&](int64_t r) -> Status {
    std::vector<int64_t> c = cpu::meshCoords(m, r);
    for (int it = 0; it < 2000; ++it) {
      const char* axis = it % 3 == 0 ? "dp" : "tp";
      int64_t x = r + it, out[4] = {0, 0, 0, 0};
      TPC_TRY(comms[r]->allReduce(axis, ReduceOp::Sum, &x, 1));
      int64_t want = 0;
      if (it % 3 == 0) want = (c[1]) + (4 + c[1]) + 2 * it;  // ranks tp, 4 + tp
      else want = (c[0] * 4) * 4 + 6 + 4 * it;                // ranks 4dp .. 4dp+3
      if (x != want) return makeError("iteration ", it, ": rank ", r, " got ", x, ", want ", want);
      int64_t me = r;
      TPC_TRY(comms[r]->allGather("tp", &me, 1, out));
      for (int k = 0; k < 4; ++k)
        if (out[k] != c[0] * 4 + k) return makeError("iteration ", it, ": bad all_gather on rank ", r);
    }
    return {};
  });
  for (auto& s : st) {
    INFO((s.ok() ? std::string() : s.error()));
    CHECK(s.ok());
  }
}

TEST_CASE("mesh communicator: a rank that never arrives gives a timeout error naming rank, op, axis, step", "[cpu][mesh]") {
  Mesh m = makeMesh({{"dp", 2}, {"tp", 2}});
  auto comms = cpu::createMeshCommunicators(m, std::chrono::milliseconds(300));
  auto t0 = std::chrono::steady_clock::now();
  std::vector<Status> st = onEveryRank(4, [&](int64_t r) -> Status {
    comms[r]->setStep(17);
    float x = 1;
    if (r == 3) return {};  // rank 3 never calls the collective
    return comms[r]->allReduce("tp", ReduceOp::Sum, &x, 1);
  });
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  CHECK(secs < 5.0);
  // Rank 2 waits for rank 3 and times out; ranks 0 and 1 completed their own group... unless the abort
  // came first, which cannot happen here: their group (tp over dp=0) has both ranks.
  CHECK(st[0].ok());
  CHECK(st[1].ok());
  REQUIRE_FALSE(st[2].ok());
  INFO(st[2].error());
  CHECK(st[2].error().find("rank 2 (dp=1, tp=0)") != std::string::npos);
  CHECK(st[2].error().find("all_reduce over axis 'tp'") != std::string::npos);
  CHECK(st[2].error().find("at step 17") != std::string::npos);
  CHECK(st[2].error().find("rank(s) 3") != std::string::npos);
  CHECK(st[2].error().find("did not complete within 0.3 s") != std::string::npos);
  // The mesh is aborted: the next collective anywhere fails at once, naming the cause.
  float x = 1;
  Status again = comms[0]->allReduce("dp", ReduceOp::Sum, &x, 1);
  REQUIRE_FALSE(again.ok());
  CHECK(again.error().find("aborted") != std::string::npos);
  CHECK(again.error().find("rank(s) 3") != std::string::npos);
  // After reset() (no rank inside a collective) the mesh works again.
  comms[0]->reset();
  auto st2 = onEveryRank(4, [&](int64_t r) -> Status {
    float y = static_cast<float>(r);
    TPC_TRY(comms[r]->allReduce("dp", ReduceOp::Sum, &y, 1));
    return y == static_cast<float>(r % 2 + (r % 2 + 2)) ? Status() : makeError("wrong sum ", y);
  });
  for (auto& s : st2) CHECK(s.ok());
}

TEST_CASE("mesh communicator: a failing rank releases the others (abort), no hang", "[cpu][mesh]") {
  Mesh m = makeMesh({{"tp", 4}});
  auto comms = cpu::createMeshCommunicators(m, std::chrono::seconds(30));
  auto t0 = std::chrono::steady_clock::now();
  std::vector<Status> st = onEveryRank(4, [&](int64_t r) -> Status {
    if (r == 1) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      comms[r]->abort("rank 1 (tp=1): matmul: out of memory");
      return makeError("rank 1 failed");
    }
    float x = 1;
    return comms[r]->allGather("tp", &x, 1, std::vector<float>(4).data());
  });
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  CHECK(secs < 5.0);  // far below the 30 s timeout
  for (int r : {0, 2, 3}) {
    REQUIRE_FALSE(st[r].ok());
    CHECK(st[r].error().find("all_gather over axis 'tp' aborted: rank 1 (tp=1): matmul: out of memory") != std::string::npos);
  }
  REQUIRE(comms[2]->abortReason().has_value());
  CHECK(*comms[2]->abortReason() == "rank 1 (tp=1): matmul: out of memory");
}

TEST_CASE("mesh communicator: ranks running different collectives get an error, not wrong data", "[cpu][mesh]") {
  Mesh m = makeMesh({{"tp", 2}});
  auto comms = cpu::createMeshCommunicators(m, std::chrono::seconds(10));
  std::vector<Status> st = onEveryRank(2, [&](int64_t r) -> Status {
    std::vector<float> x(4, 1.0f), out(8);
    if (r == 0) return comms[r]->allReduce("tp", ReduceOp::Sum, x.data(), 4);
    return comms[r]->allGather("tp", x.data(), 4, out.data());
  });
  REQUIRE_FALSE(st[0].ok());
  REQUIRE_FALSE(st[1].ok());
  CHECK((st[0].error() + st[1].error()).find("disagree") != std::string::npos);
}

// ---- dropout and attention on shards --------------------------------------------------------------

namespace {

std::vector<HostTensor> runOne(const Graph& g, const std::vector<HostTensor>& inputs, int64_t step = 3) {
  auto exec = CpuExecutor::create(g, CpuOptions{});
  if (!exec.ok()) FAIL(exec.error());
  std::vector<const HostTensor*> in;
  for (const HostTensor& t : inputs) in.push_back(&t);
  auto out = (*exec)->run(in, {}, step);
  if (!out.ok()) FAIL(out.error());
  return *out;
}

Placement splitOn(const std::string& axis, int64_t dim) {
  Placement p;
  p.set(axis, AxisPlacement::split(dim));
  return p;
}

bool sameBits(const HostTensor& a, const HostTensor& b) {
  return a.type() == b.type() && std::memcmp(a.raw(), b.raw(), a.bytes()) == 0;
}

}  // namespace

TEST_CASE("cpu: dropout on two column shards draws the two halves of the unsharded mask", "[cpu][mesh][dropout]") {
  std::mt19937 rng(5);
  TensorType full(DType::f32, {4, 6}), half(DType::f32, {4, 3});
  HostTensor x = randomTensor(full, rng, false, 0.5, 1.5);
  auto whole = oneOp(OpKind::Dropout, {full}, [] {
    AttrDict a;
    a.set("p", 0.5);
    a.set("key", 11);
    return a;
  }());
  HostTensor ref = runOne(*whole.graph, {x})[0];
  int zeros = 0;
  for (int64_t i = 0; i < ref.numel(); ++i) zeros += ref.getAsDouble(i) == 0.0;
  CHECK(zeros > 3);
  CHECK(zeros < 21);
  Mesh m = makeMesh({{"tp", 2}});
  HostTensor assembled(TensorType(DType::f32, {4, 6}));
  for (int64_t r = 0; r < 2; ++r) {
    AttrDict a;
    a.set("p", 0.5);
    a.set("key", 11);
    a.set("global_shape", std::vector<int64_t>{4, 6});
    a.set("offsets", std::vector<int64_t>{0, 3 * r});
    auto shard = oneOp(OpKind::Dropout, {half}, a);
    HostTensor xs = *sliceForRank(x, splitOn("tp", 1), m, r);
    HostTensor ys = runOne(*shard.graph, {xs})[0];
    REQUIRE(placeIntoGlobal(ys, splitOn("tp", 1), m, r, assembled).ok());
  }
  CHECK(sameBits(assembled, ref));

  // Row shards too (offsets on dim 0), and a misplaced shard is an error.
  AttrDict a;
  a.set("p", 0.5);
  a.set("key", 11);
  a.set("global_shape", std::vector<int64_t>{4, 6});
  a.set("offsets", std::vector<int64_t>{2, 0});
  auto rows = oneOp(OpKind::Dropout, {TensorType(DType::f32, {2, 6})}, a);
  HostTensor yr = runOne(*rows.graph, {*sliceForRank(x, splitOn("tp", 0), m, 1)})[0];
  CHECK(sameBits(yr, *sliceForRank(ref, splitOn("tp", 0), m, 1)));
  a.set("offsets", std::vector<int64_t>{3, 0});
  auto bad = oneOp(OpKind::Dropout, {TensorType(DType::f32, {2, 6})}, a);
  auto exec = CpuExecutor::create(*bad.graph, CpuOptions{});
  REQUIRE(exec.ok());
  HostTensor xb(TensorType(DType::f32, {2, 6}));
  auto res = (*exec)->run({&xb}, {}, 0);
  REQUIRE_FALSE(res.ok());
  CHECK(res.error().find("does not fit in global_shape [4,6]") != std::string::npos);
}

TEST_CASE("cpu: attention and attention_grad with heads split 2 ways match the unsharded op", "[cpu][mesh][attention]") {
  std::mt19937 rng(9);
  TensorType full(DType::f32, {2, 4, 5, 3}), half(DType::f32, {2, 2, 5, 3});
  TensorType lseFull(DType::f32, {2, 4, 5}), lseHalf(DType::f32, {2, 2, 5});
  HostTensor q = randomTensor(full, rng, false), k = randomTensor(full, rng, false), v = randomTensor(full, rng, false),
             dout = randomTensor(full, rng, false);
  auto attrs = [](std::vector<int64_t> gs, std::vector<int64_t> off) {
    AttrDict a;
    a.set("dropout", 0.3);
    a.set("key", 4);
    if (!gs.empty()) {
      a.set("global_shape", gs);
      a.set("offsets", off);
    }
    return a;
  };
  auto fwd = oneOp(OpKind::Attention, {full, full, full}, attrs({}, {}));
  auto ref = runOne(*fwd.graph, {q, k, v});
  auto bwd = oneOp(OpKind::AttentionGrad, {full, full, full, full, full, lseFull}, attrs({}, {}));
  auto refGrad = runOne(*bwd.graph, {dout, q, k, v, ref[0], ref[1]});

  Mesh m = makeMesh({{"tp", 2}});
  Placement heads = splitOn("tp", 1);
  std::vector<HostTensor> assembled = {HostTensor(full), HostTensor(lseFull), HostTensor(full), HostTensor(full),
                                       HostTensor(full)};
  for (int64_t r = 0; r < 2; ++r) {
    auto s = [&](const HostTensor& t) { return *sliceForRank(t, heads, m, r); };
    auto f = oneOp(OpKind::Attention, {half, half, half}, attrs({2, 4}, {0, 2 * r}));
    auto out = runOne(*f.graph, {s(q), s(k), s(v)});
    auto b = oneOp(OpKind::AttentionGrad, {half, half, half, half, half, lseHalf}, attrs({2, 4}, {0, 2 * r}));
    auto grads = runOne(*b.graph, {s(dout), s(q), s(k), s(v), out[0], out[1]});
    REQUIRE(placeIntoGlobal(out[0], heads, m, r, assembled[0]).ok());
    REQUIRE(placeIntoGlobal(out[1], heads, m, r, assembled[1]).ok());
    for (int i = 0; i < 3; ++i) REQUIRE(placeIntoGlobal(grads[i], heads, m, r, assembled[2 + i]).ok());
  }
  CHECK(sameBits(assembled[0], ref[0]));
  CHECK(sameBits(assembled[1], ref[1]));
  for (int i = 0; i < 3; ++i) CHECK(sameBits(assembled[2 + i], refGrad[i]));
  // Without the attributes, shard 1 would draw shard 0's mask: the test above is not vacuous.
  auto plain = oneOp(OpKind::Attention, {half, half, half}, attrs({}, {}));
  auto s1 = [&](const HostTensor& t) { return *sliceForRank(t, heads, m, 1); };
  CHECK_FALSE(sameBits(runOne(*plain.graph, {s1(q), s1(k), s1(v)})[0], *sliceForRank(ref[0], heads, m, 1)));
}

// ---- the mesh backend ------------------------------------------------------------------------------

namespace {

std::unique_ptr<Graph> parse(const std::string& text) {
  auto g = parseGraph(text);
  if (!g.ok()) FAIL(g.error());
  return std::move(g).value();
}

std::vector<std::unique_ptr<Graph>> copies(const std::string& text, int64_t n) {
  std::vector<std::unique_ptr<Graph>> gs;
  for (int64_t r = 0; r < n; ++r) gs.push_back(parse(text));
  return gs;
}

const char* kMlp = R"(
graph @mlp(%x: f32[4,8])
    params(%w1: f32[8,16] init=normal(0.5), %w2: f32[16,8] init=normal(0.5)) {
  %h = matmul(%x, %w1) : f32[4,16]
  %a = gelu(%h) : f32[4,16]
  %y = matmul(%a, %w2) : f32[4,8]
  %w1n = scale(%w1) {factor=0.5} : f32[8,16]
  return %y, w1=%w1n
}
)";

// Megatron MLP over tp=2: w1 by column, w2 by row, the partial sums all-reduced.
const char* kMlpTp2 = R"(
graph @mlp_tp2(%x: f32[4,8] place=[tp:R])
    params(%w1: f32[8,8] init=normal(0.5) place=[tp:S(1)], %w2: f32[8,8] init=normal(0.5) place=[tp:S(0)])
    mesh(tp=2) {
  %h = matmul(%x, %w1) : f32[4,8] {place=[tp:S(1)]}
  %a = gelu(%h) : f32[4,8] {place=[tp:S(1)]}
  %yp = matmul(%a, %w2) : f32[4,8] {place=[tp:P]}
  %y = all_reduce(%yp) {axis=tp, op=sum} : f32[4,8] {place=[tp:R]}
  %w1n = scale(%w1) {factor=0.5} : f32[8,8] {place=[tp:S(1)]}
  return %y, w1=%w1n
}
)";

}  // namespace

TEST_CASE("cpu mesh backend: a hand-partitioned tp=2 MLP matches the unsharded one", "[cpu][mesh][backend]") {
  for (bool fp64 : {false, true}) {
    INFO("fp64 " << fp64);
    std::mt19937 rng(21);
    auto ref = parse(kMlp);
    TensorMap state{{"w1", randomTensor(TensorType(DType::f32, {8, 16}), rng, false)},
                    {"w2", randomTensor(TensorType(DType::f32, {16, 8}), rng, false)}};
    TensorMap inputs{{"x", randomTensor(TensorType(DType::f32, {4, 8}), rng, false)}};
    CpuOptions o;
    o.fp64 = fp64;
    auto single = createCpuBackend(o);
    REQUIRE(single->prepare(*ref, state).ok());
    auto mesh = createCpuMeshBackend(copies(kMlpTp2, 2), o);
    REQUIRE(mesh->prepare(*ref, state).ok());
    CHECK(mesh->name() == (fp64 ? "cpu-fp64 (2 ranks)" : "cpu (2 ranks)"));
    for (int step = 0; step < 2; ++step) {  // the second step sees the updated w1
      auto a = single->step(inputs, step);
      auto b = mesh->step(inputs, step);
      REQUIRE(a.ok());
      if (!b.ok()) FAIL(b.error());
      REQUIRE(b->size() == 1);
      const HostTensor &ya = a->at("y"), &yb = b->at("y");
      REQUIRE(ya.shape() == yb.shape());
      for (int64_t i = 0; i < ya.numel(); ++i)
        REQUIRE(std::abs(ya.getAsDouble(i) - yb.getAsDouble(i)) <= 1e-6 * std::max(1.0, std::abs(ya.getAsDouble(i))));
      HostTensor w1a = *single->readState("w1"), w1b = *mesh->readState("w1");
      CHECK(sameBits(w1a, w1b));
    }
  }
}

TEST_CASE("cpu mesh backend: prepare slices the state, readState gathers it back (2-D mesh)", "[cpu][mesh][backend]") {
  // Each rank just returns its parameters; placements cover S on one axis, S on both axes of one dim, R.
  const char* text = R"(
graph @state(%x: f32[2] place=[dp:S(0)])
    params(%a: f32[3,2] place=[tp:S(1)], %b: f32[2,6] place=[dp:S(0), tp:S(1)], %c: f32[1,3] place=[dp:S(1), tp:S(1)],
           %d: f32[5] place=[dp:R, tp:R])
    mesh(dp=2, tp=2) {
  %a2 = scale(%a) {factor=1.0} : f32[3,2]
  %s = reduce_sum(%x) {axes=[0]} : f32[]
  %t = all_reduce(%s) {axis=dp, op=sum} : f32[] {place=[dp:R, tp:R]}
  return a=%a2, %t
}
)";
  std::mt19937 rng(3);
  TensorMap state{{"a", randomTensor(TensorType(DType::f32, {3, 4}), rng, false)},
                  {"b", randomTensor(TensorType(DType::f32, {4, 12}), rng, false)},
                  {"c", randomTensor(TensorType(DType::f32, {1, 12}), rng, false)},
                  {"d", randomTensor(TensorType(DType::f32, {5}), rng, false)}};
  auto backend = createCpuMeshBackend(copies(text, 4), CpuOptions{});
  auto ref = parse(text);
  REQUIRE(backend->prepare(*ref, state).ok());
  for (const char* name : {"a", "b", "c", "d"}) {
    INFO(name);
    auto got = backend->readState(name);
    REQUIRE(got.ok());
    CHECK(sameBits(*got, state[name]));
  }
  // Inputs are sliced too: x f32[4] over dp: the sum over dp of each rank's half is the whole sum.
  HostTensor x(TensorType(DType::f32, {4}));
  for (int i = 0; i < 4; ++i) x.data<float>()[i] = static_cast<float>(i + 1);
  auto out = backend->step({{"x", x}}, 0);
  if (!out.ok()) FAIL(out.error());
  CHECK(out->at("t").getAsDouble(0) == 10.0);
  CHECK(sameBits(*backend->readState("a"), state["a"]));
  // Nested splits: b's dim 1 (12) is split by tp only; check one block by hand.
  auto b = backend->readState("b");
  CHECK(sameBits(*b, state["b"]));
  // A wrong unsharded shape is refused, naming the parameter.
  state["b"] = HostTensor(TensorType(DType::f32, {4, 10}));
  Status bad = backend->prepare(*ref, state);
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.error().find("%b") != std::string::npos);
  auto after = backend->step({{"x", x}}, 1);
  REQUIRE_FALSE(after.ok());
  CHECK(after.error().find("before a successful prepare()") != std::string::npos);
  CHECK(backend->readState("nope").ok() == false);
}

TEST_CASE("cpu mesh backend: readState refuses a replicated parameter whose copies drifted apart", "[cpu][mesh][backend]") {
  // Rank 1 updates its copy of the replicated %w differently from rank 0 (what a replicated param updated
  // from grads that differ between ranks would do); gathering it must not silently take one of the copies.
  const char* same = R"(
graph @u(%x: f32[2]) params(%w: f32[2] place=[tp:R]) mesh(tp=2) {
  %w2 = add(%w, %x) : f32[2]
  return w=%w2
}
)";
  const char* other = R"(
graph @u(%x: f32[2]) params(%w: f32[2] place=[tp:R]) mesh(tp=2) {
  %w2 = sub(%w, %x) : f32[2]
  return w=%w2
}
)";
  HostTensor x(TensorType(DType::f32, {2}));
  x.data<float>()[0] = 1.0f;
  x.data<float>()[1] = 2.0f;
  TensorMap state{{"w", HostTensor(TensorType(DType::f32, {2}))}};
  for (bool drift : {false, true}) {
    std::vector<std::unique_ptr<Graph>> gs;
    gs.push_back(parse(same));
    gs.push_back(parse(drift ? other : same));
    auto backend = createCpuMeshBackend(std::move(gs), CpuOptions{});
    auto ref = parse(same);
    REQUIRE(backend->prepare(*ref, state).ok());
    REQUIRE(backend->step({{"x", x}}, 0).ok());
    auto w = backend->readState("w");
    if (!drift) {
      REQUIRE(w.ok());
      CHECK(w->data<float>()[1] == 2.0f);
    } else {
      REQUIRE_FALSE(w.ok());
      CHECK(w.error() == "cpu mesh backend: state %w is replicated between rank 0 (tp=0) and rank 1 (tp=1) but their copies differ");
    }
  }
}

TEST_CASE("cpu mesh backend: a failing rank gives one error naming it and the others do not hang", "[cpu][mesh][backend]") {
  // Rank 1's integer division by zero fails before the all_reduce that rank 0 waits in.
  const char* text = R"(
graph @fail(%n: i32[1] place=[tp:S(0)], %x: f32[2] place=[tp:R])
    params() mesh(tp=2) {
  %q = div(%n, %n) : i32[1] {place=[tp:S(0)]}
  %s = all_reduce(%x) {axis=tp, op=sum} : f32[2] {place=[tp:R]}
  return %s, %q
}
)";
  CpuMeshOptions mo;
  mo.collectiveTimeout = std::chrono::seconds(30);
  auto backend = createCpuMeshBackend(copies(text, 2), CpuOptions{}, mo);
  auto ref = parse(text);
  REQUIRE(backend->prepare(*ref, {}).ok());
  HostTensor n(TensorType(DType::i32, {2})), x(TensorType(DType::f32, {2}));
  n.data<int32_t>()[0] = 1;  // rank 0 divides by 1, rank 1 by 0
  auto t0 = std::chrono::steady_clock::now();
  auto out = backend->step({{"n", n}, {"x", x}}, 5);
  CHECK(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() < 5.0);
  REQUIRE_FALSE(out.ok());
  CHECK(out.error().find("rank 1 (tp=1): div: integer division by zero") == 0);
  // The next step runs again (the abort is cleared between steps); %q is S(0): refused as an output.
  n.data<int32_t>()[1] = 2;
  auto again = backend->step({{"n", n}, {"x", x}}, 6);
  REQUIRE_FALSE(again.ok());
  CHECK(again.error().find("output %q is [tp:S(0)]") != std::string::npos);
}

TEST_CASE("cpu mesh backend: a collective timeout fails the step with rank, op, axis and step", "[cpu][mesh][backend]") {
  // The two ranks run different programs: rank 1 never reaches the all_reduce.
  const char* text0 = R"(
graph @r(%x: f32[2]) params() mesh(tp=2) {
  %s = all_reduce(%x) {axis=tp, op=sum} : f32[2]
  return %s
}
)";
  const char* text1 = R"(
graph @r(%x: f32[2]) params() mesh(tp=2) {
  %s = scale(%x) {factor=2.0} : f32[2]
  return %s
}
)";
  std::vector<std::unique_ptr<Graph>> gs;
  gs.push_back(parse(text0));
  gs.push_back(parse(text1));
  CpuMeshOptions mo;
  mo.collectiveTimeout = std::chrono::milliseconds(200);
  auto backend = createCpuMeshBackend(std::move(gs), CpuOptions{}, mo);
  auto ref = parse(text0);
  REQUIRE(backend->prepare(*ref, {}).ok());
  auto out = backend->step({{"x", HostTensor(TensorType(DType::f32, {2}))}}, 9);
  REQUIRE_FALSE(out.ok());
  CHECK(out.error().find("rank 0 (tp=0): all_reduce over axis 'tp' at step 9 did not complete within 0.2 s: rank(s) 1") == 0);
}

TEST_CASE("cpu mesh backend: tests/ir/gpt_block_tp2.tir runs on two ranks, deterministically", "[cpu][mesh][backend][gpt]") {
  auto read = [] {
    auto g = parseGraphFile(sourcePath("tests/ir/gpt_block_tp2.tir"));
    if (!g.ok()) FAIL(g.error());
    return std::move(g).value();
  };
  auto g0 = read();
  std::mt19937 rng(8);
  TensorMap state;
  for (Value* p : g0->params()) {
    auto gs = globalShape(p->shape(), p->placement(), g0->mesh());
    REQUIRE(gs.ok());
    state[p->name()] = randomTensor(TensorType(p->dtype(), *gs), rng, false, -0.1, 0.1);
  }
  TensorMap inputs{{"x", randomTensor(TensorType(DType::f32, {2, 16, 64}), rng, false)}};
  std::vector<HostTensor> results;
  for (int run = 0; run < 2; ++run) {
    std::vector<std::unique_ptr<Graph>> gs;
    for (int r = 0; r < 2; ++r) {
      auto g = read();
      // Heads 2r, 2r+1 of 4: draw the unsharded attention-dropout mask.
      for (Node* n : g->nodes())
        if (n->op() == OpKind::Attention) {
          n->setAttr("global_shape", std::vector<int64_t>{2, 4});
          n->setAttr("offsets", std::vector<int64_t>{0, 2 * r});
        }
      gs.push_back(std::move(g));
    }
    CpuOptions o;
    o.threads = 2;
    auto backend = createCpuMeshBackend(std::move(gs), o);
    REQUIRE(backend->prepare(*g0, state).ok());
    auto out = backend->step(inputs, 1);  // the backend checks both ranks return identical %x2
    if (!out.ok()) FAIL(out.error());
    results.push_back(out->at("x2"));
  }
  CHECK(sameBits(results[0], results[1]));
  for (int64_t i = 0; i < results[0].numel(); ++i) REQUIRE(std::isfinite(results[0].getAsDouble(i)));
}
