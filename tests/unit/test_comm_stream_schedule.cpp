// The communication stream's fork/join schedule (runtime/cuda/comm_stream_schedule.h) on byte ranges, and
// the memory plan keeping a collective's buffers live until its join (runtime/memory_plan.h), together
// on a tp 2 GPT step: every collective is joined exactly at its first reader. No GPU needed.
#ifdef TPC_HAVE_CUDA
#include <catch2/catch.hpp>

#include "gpt_step_support.h"
#include "ir/fusion_group.h"
#include "ir/parser.h"
#include "ir/verifier.h"
#include "passes/builtin_passes.h"
#include "runtime/cuda/comm_stream_schedule.h"
#include "runtime/cuda/lowering.h"
#include "runtime/cuda/memory_plan.h"

namespace tpc {
namespace {

using namespace cuda;

// Buffers at 1000 * k: X(0) = [0, 1000), X(1) = [1000, 2000), ...
ByteRange X(uintptr_t k) { return {1000 * k, 1000 * k + 1000}; }

ScheduledLaunch compute(std::vector<ByteRange> reads, std::vector<ByteRange> writes) { return {-1, reads, writes}; }
ScheduledLaunch coll(int id, std::vector<ByteRange> reads, std::vector<ByteRange> writes) { return {id, reads, writes}; }

}  // namespace

TEST_CASE("comm stream schedule: a collective consumed by the next launch is joined right there", "[cuda][comm_stream]") {
  // produce X0; all_reduce X0 -> X1; read X1.
  CommSchedule s = scheduleCommStream({compute({}, {X(0)}), coll(7, {X(0)}, {X(1)}), compute({X(1)}, {X(2)})});
  REQUIRE(s.collectives.size() == 1);
  CHECK(s.collectives[0].first == 1);
  CHECK(s.collectives[0].last == 1);
  CHECK(s.collectives[0].fork);
  CHECK(s.collectiveOf == std::vector<int>{-1, 0, -1});
  CHECK(s.joinBefore == std::vector<int>{-1, -1, 0});
  CHECK(s.joinAtEnd == -1);
  CHECK(s.forks == 1);
  CHECK(s.joins == 1);
  CHECK(s.overlapped == 0);
}

TEST_CASE("comm stream schedule: independent compute overlaps a collective consumed late", "[cuda][comm_stream]") {
  // all_reduce X0 -> X1 (a weight gradient); two launches on other buffers (the next layer's backward)
  // read X0 too (read after read: no conflict); then the optimizer reads X1.
  CommSchedule s = scheduleCommStream({compute({}, {X(0)}), coll(0, {X(0)}, {X(1)}), compute({X(0), X(3)}, {X(4)}),
                                       compute({X(4)}, {X(5)}), compute({X(1), X(5)}, {X(6)})});
  CHECK(s.joinBefore == std::vector<int>{-1, -1, -1, -1, 0});
  CHECK(s.overlapped == 2);
  CHECK(s.joins == 1);
  CHECK(s.joinAtEnd == -1);

  // Never read again: joined at the step's end, everything after it overlaps.
  s = scheduleCommStream({coll(0, {X(0)}, {X(1)}), compute({X(3)}, {X(4)})});
  CHECK(s.joinBefore == std::vector<int>{-1, -1});
  CHECK(s.joinAtEnd == 0);
  CHECK(s.joins == 1);
  CHECK(s.overlapped == 1);
  CHECK(s.collectives[0].fork);  // the first collective always forks: the comm stream must join the capture
}

TEST_CASE("comm stream schedule: a launch that overwrites any byte of a collective's buffers waits for it", "[cuda][comm_stream]") {
  // The memory plan reused part of the all_reduce's input [0, 1000) for a later result at [500, 1500):
  // writing there while the collective reads its input would corrupt it.
  ByteRange reuse{500, 1500};
  CommSchedule s = scheduleCommStream({coll(0, {X(0)}, {X(2)}), compute({X(5)}, {reuse}), compute({X(2)}, {X(6)})});
  CHECK(s.joinBefore == std::vector<int>{-1, 0, -1});
  CHECK(s.overlapped == 0);
  // Its output's bytes overwritten (write after write): joined too.
  s = scheduleCommStream({coll(0, {X(0)}, {X(2)}), compute({X(5)}, {{2999, 3001}})});
  CHECK(s.joinBefore == std::vector<int>{-1, 0});
  // Adjacent, not overlapping ([1000, 2000) ends where X(2) begins): no conflict, joined at the end.
  s = scheduleCommStream({coll(0, {X(0)}, {X(2)}), compute({X(1)}, {X(1), X(3)})});
  CHECK(s.joinBefore == std::vector<int>{-1, -1});
  CHECK(s.joinAtEnd == 0);
  // Empty ranges touch nothing.
  s = scheduleCommStream({coll(0, {X(0)}, {X(2)}), compute({{2500, 2500}}, {{100, 100}})});
  CHECK(s.joinBefore == std::vector<int>{-1, -1});
}

TEST_CASE("comm stream schedule: back-to-back collectives stay ordered on the comm stream", "[cuda][comm_stream]") {
  // all_reduce X0 -> X1, then all_gather X1 -> X2 with nothing between: the second one needs no fork (and no
  // join for reading X1: the comm stream orders them); reading X2 joins the second, which covers the first.
  CommSchedule s = scheduleCommStream({compute({}, {X(0)}), coll(3, {X(0)}, {X(1)}), coll(4, {X(1)}, {X(2)}),
                                       compute({X(2)}, {X(5)}), compute({X(1)}, {X(6)})});
  REQUIRE(s.collectives.size() == 2);
  CHECK(s.collectives[0].fork);
  CHECK(!s.collectives[1].fork);
  CHECK(s.collectiveOf == std::vector<int>{-1, 0, 1, -1, -1});
  CHECK(s.joinBefore == std::vector<int>{-1, -1, -1, 1, -1});
  CHECK(s.forks == 1);
  CHECK(s.joins == 1);
  CHECK(s.joinAtEnd == -1);

  // With compute between them each forks; reading the first's output joins only the first, and the
  // second is joined at the end.
  s = scheduleCommStream({coll(0, {X(0)}, {X(1)}), compute({X(7)}, {X(8)}), coll(1, {X(8)}, {X(2)}),
                          compute({X(1)}, {X(5)})});
  REQUIRE(s.collectives.size() == 2);
  CHECK(s.collectives[1].fork);
  CHECK(s.forks == 2);
  CHECK(s.joinBefore == std::vector<int>{-1, -1, -1, 0});
  CHECK(s.joinAtEnd == 1);
  CHECK(s.joins == 2);
  CHECK(s.overlapped == 2);
}

TEST_CASE("comm stream schedule: a collective of several launches (virtual ranks' kernels) forks and ends once", "[cuda][comm_stream]") {
  // Two ranks' all_reduce as two kernels with one id, then an all_gather (another id) right after.
  CommSchedule s = scheduleCommStream({compute({}, {X(0), X(1)}), coll(0, {X(0), X(1)}, {X(2), X(3)}),
                                       coll(0, {X(0), X(1)}, {X(2), X(3)}), coll(1, {X(2)}, {X(4)}),
                                       coll(1, {X(3)}, {X(4)}), compute({X(3)}, {X(9)})});
  REQUIRE(s.collectives.size() == 2);
  CHECK(s.collectives[0].first == 1);
  CHECK(s.collectives[0].last == 2);
  CHECK(s.collectives[1].first == 3);
  CHECK(s.collectives[1].last == 4);
  // X3 is written by collective 0: the join waits for it (the later collective 1 need not have finished).
  CHECK(s.joinBefore[5] == 0);
  CHECK(s.joinAtEnd == 1);
}

namespace {

std::unique_ptr<Graph> parseText(const char* text) {
  auto g = parseGraph(text);
  INFO((g.ok() ? std::string() : g.error()));
  REQUIRE(g.ok());
  return std::move(g).value();
}

const Value* valueNamed(const Graph& g, const std::string& name) {
  for (const Node* n : g.nodes())
    for (const Value* v : n->results())
      if (v->hasName() && v->name() == name) return v;
  FAIL("no value %" << name);
  return nullptr;
}

bool disjoint(const PlannedBuffer& a, const PlannedBuffer& b) {
  return a.offset + a.bytes <= b.offset || b.offset + b.bytes <= a.offset;
}

}  // namespace

TEST_CASE("memory plan: a collective on the comm stream keeps its buffers live until its first reader", "[cuda][comm_stream]") {
  auto g = parseText(R"(graph @g(%x: f32[64] place=[tp:R]) mesh(tp=2) {
  %a = neg(%x) : f32[64] {place=[tp:P]}
  %s = all_reduce(%a) {axis=tp, op=sum} : f32[64] {place=[tp:R]}
  %b = exp(%x) : f32[64] {place=[tp:R]}
  %c = neg(%b) : f32[64] {place=[tp:R]}
  %r = reshape(%s) {shape=[8,8]} : f32[8,8] {place=[tp:R]}
  %cr = reshape(%c) {shape=[8,8]} : f32[8,8] {place=[tp:R]}
  %d = add(%r, %cr) : f32[8,8] {place=[tp:R]}
  return %d
})");
  auto onComm = [](const Node& n) { return nodeExec(n) == NodeExec::Collective; };
  std::vector<int64_t> ws(g->numNodes(), 0);
  ws[1] = 512;  // a staging buffer (NCCL's all_gather and reduce_scatter have one)
  StepMemoryPlan one = cuda::planStepMemory(*g, ws), two = cuda::planStepMemory(*g, ws, nullptr, 256, onComm);
  auto buf = [&](const StepMemoryPlan& p, const char* name) { return p.buffers[p.bufferOf.lookup(valueNamed(*g, name))]; };
  // One stream: %a dies at the all_reduce (node 1) and its bytes are reused.
  CHECK(buf(one, "a").last == 1);
  CHECK(one.buffers[one.workspaceOf[1]].last == 1);
  // Comm stream: %a, %s and the workspace live to node 6, %d, which reads %s through the view %r (the
  // views, nodes 4 and 5, run nothing); %b and %c (nodes 2 and 3, run meanwhile) get bytes of their own.
  CHECK(buf(two, "a").last == 6);
  CHECK(buf(two, "s").last == 6);
  CHECK(two.buffers[two.workspaceOf[1]].last == 6);
  for (const char* other : {"b", "c"}) {
    INFO(other);
    CHECK(disjoint(buf(two, other), buf(two, "a")));
    CHECK(disjoint(buf(two, other), buf(two, "s")));
    CHECK(disjoint(buf(two, other), two.buffers[two.workspaceOf[1]]));
  }
  CHECK(two.arenaBytes > one.arenaBytes);
}

namespace {

std::vector<std::string> order(const Graph& g) {
  std::vector<std::string> names;
  for (const Node* n : g.nodes()) names.push_back(n->result()->hasName() ? n->result()->name() : "?");
  return names;
}

}  // namespace

TEST_CASE("hoist-collectives: a collective moves up to just after its operand's producer, in order", "[cuda][comm_stream]") {
  auto g = parseText(R"(graph @g(%x: f32[4,8] place=[tp:R], %y: f32[4,8] place=[tp:R]) mesh(tp=2) {
  %dx = neg(%x) : f32[4,8] {place=[tp:P]}
  %dw = exp(%y) : f32[4,8] {place=[tp:R]}
  %dw2 = neg(%dw) : f32[4,8] {place=[tp:R]}
  %r = reshape(%dx) {shape=[32]} : f32[32] {place=[tp:P]}
  %s = all_reduce(%r) {axis=tp, op=sum} : f32[32] {place=[tp:R]}
  %m = neg(%y) : f32[4,8] {place=[tp:P]}
  %t = all_reduce(%m) {axis=tp, op=sum} : f32[4,8] {place=[tp:R]}
  %u = all_reduce(%x) {axis=tp, op=max} : f32[4,8] {place=[tp:R]}
  %e = add(%t, %u) : f32[4,8] {place=[tp:R]}
  return %s, %dw2, %e
})");
  auto changed = createHoistCollectivesPass()->run(*g);
  REQUIRE(changed.ok());
  CHECK(*changed);
  // %s (with the reshape only it reads) right after %dx; %t after %m; %u, whose operand is an input, stays
  // after %t (collectives keep their order).
  CHECK(order(*g) == std::vector<std::string>{"dx", "r", "s", "dw", "dw2", "m", "t", "u", "e"});
  changed = createHoistCollectivesPass()->run(*g);
  REQUIRE(changed.ok());
  CHECK(!*changed);

  // A producer in a fusion group: its value exists once the group's last member ran.
  auto f = parseText(R"(graph @f(%x: f32[8] place=[tp:R]) mesh(tp=2) {
  %a = neg(%x) {fusion_group=1} : f32[8] {place=[tp:P]}
  %b = exp(%x) : f32[8] {place=[tp:R]}
  %c = neg(%b) {fusion_group=1} : f32[8] {place=[tp:R]}
  %d = exp(%c) : f32[8] {place=[tp:R]}
  %s = all_reduce(%a) {axis=tp, op=sum} : f32[8] {place=[tp:R]}
  return %s, %d
})");
  REQUIRE(createHoistCollectivesPass()->run(*f).ok());
  CHECK(order(*f) == std::vector<std::string>{"a", "b", "c", "s", "d"});
}

TEST_CASE("hoist-collectives: a fused tp 2 GPT rank, rewritten as the CUDA backend does, keeps valid fusion groups", "[cuda][comm_stream]") {
  auto step = test::gptStep(test::smallGpt(), 2, test::megatronTp(2) + test::kTrainPasses + ",fuse");
  auto ranks = test::rankGraphs(*step);
  REQUIRE(ranks.size() == 2);
  for (auto& g : ranks) {
    REQUIRE(rewriteForCuda(*g).ok());
    auto before = fusionGroups(*g);
    REQUIRE(before.ok());
    auto changed = createHoistCollectivesPass()->run(*g);
    REQUIRE(changed.ok());
    CHECK(*changed);
    auto after = fusionGroups(*g);  // no collective reads a group's value before the group's kernel runs
    INFO((after.ok() ? std::string() : after.error()));
    REQUIRE(after.ok());
    CHECK(after->size() == before->size());
    CHECK(verifyGraph(*g).ok());
  }
}

TEST_CASE("comm stream schedule: on a tp 2 GPT step with its memory plan, each collective is joined at its first reader", "[cuda][comm_stream]") {
  GptConfig c = test::smallGpt();
  auto step = test::gptStep(c, 2, test::megatronTp(2) + test::kTrainPasses);
  auto ranks = test::rankGraphs(*step);
  REQUIRE(ranks.size() == 2);
  // As the CUDA backend prepares a rank with the communication stream on.
  REQUIRE(createHoistCollectivesPass()->run(*ranks[0]).ok());
  const Graph& g = *ranks[0];
  auto onComm = [](const Node& n) { return nodeExec(n) == NodeExec::Collective; };
  StepMemoryPlan plan = cuda::planStepMemory(g, std::vector<int64_t>(g.numNodes(), 0), nullptr, 256, onComm);
  // Addresses as the backend gives them: the arena at 0, parameters and inputs far above it.
  const uintptr_t far = uintptr_t(1) << 40;
  llvm::DenseMap<const Value*, uintptr_t> outside;
  for (const Value* v : g.params()) outside[v] = far + (outside.size() << 30);
  for (const Value* v : g.inputs()) outside[v] = far + (outside.size() << 30);
  auto range = [&](const Value* v) {
    const Value* root = plan.viewOf.count(v) ? plan.viewOf.lookup(v) : v;
    if (plan.bufferOf.count(root)) {
      const PlannedBuffer& b = plan.buffers[plan.bufferOf.lookup(root)];
      return ByteRange{uintptr_t(b.offset), uintptr_t(b.offset + b.bytes)};
    }
    if (plan.inPlace.count(root)) {
      for (const Value* p : g.params())
        if (p->name() == plan.inPlace.lookup(root)) root = p;
    }
    REQUIRE(outside.count(root));
    return ByteRange{outside.lookup(root), outside.lookup(root) + uintptr_t(root->type().bytes())};
  };
  // One launch per node that runs something, in graph order (no fusion groups here).
  std::vector<Node*> nodes = g.nodeVector();
  std::vector<ScheduledLaunch> launches;
  std::vector<int> launchOfNode(nodes.size(), -1), collectiveNodes;
  for (size_t k = 0; k < nodes.size(); ++k) {
    const Node& n = *nodes[k];
    if (nodeExec(n) == NodeExec::View) continue;
    ScheduledLaunch l;
    if (onComm(n)) {
      l.collective = static_cast<int>(k);
      collectiveNodes.push_back(static_cast<int>(k));
    }
    for (const Value* v : n.operands()) l.reads.push_back(range(v));
    for (const Value* v : n.results()) l.writes.push_back(range(v));
    launchOfNode[k] = static_cast<int>(launches.size());
    launches.push_back(l);
  }
  REQUIRE(collectiveNodes.size() >= 8);  // per layer: 2 in the forward, 2 in the backward, and more
  // Where each collective must be joined: its first later reader (through views), else the end.
  auto rootOf = [&](const Value* v) { return plan.viewOf.count(v) ? plan.viewOf.lookup(v) : v; };
  std::vector<int> firstReader;
  for (int k : collectiveNodes) {
    int at = static_cast<int>(launches.size());
    for (size_t m = k + 1; m < nodes.size() && at == static_cast<int>(launches.size()); ++m)
      if (launchOfNode[m] >= 0)
        for (const Value* v : nodes[m]->operands())
          if (rootOf(v) == rootOf(nodes[k]->result())) at = launchOfNode[m];
    firstReader.push_back(at);
  }
  // The joins that implies (waiting for a later collective covers the earlier ones).
  std::vector<int> expected(launches.size(), -1);
  int joined = -1;
  for (size_t i = 0; i < launches.size(); ++i)
    for (int c = static_cast<int>(firstReader.size()) - 1; c > joined; --c)
      if (firstReader[c] == static_cast<int>(i)) {
        expected[i] = joined = c;
        break;
      }
  CommSchedule s = scheduleCommStream(launches);
  REQUIRE(s.collectives.size() == collectiveNodes.size());
  CHECK(s.joinBefore == expected);
  CHECK(s.joinAtEnd == (joined + 1 < static_cast<int>(firstReader.size()) ? static_cast<int>(firstReader.size()) - 1 : -1));
  WARN("tp 2 GPT step, rank 0: " << launches.size() << " launches, " << s.collectives.size() << " collectives, "
                                 << s.forks << " forks, " << s.joins << " joins, " << s.overlapped << " launches overlap them");
  CHECK(s.overlapped > 0);  // some backward compute runs while a collective does
}

}  // namespace tpc
#endif
