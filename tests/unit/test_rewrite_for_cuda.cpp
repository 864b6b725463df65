// rewriteForCuda's rewrites together on whole GPT training steps, as the CUDA backend runs them (after fuse;
// every epilogue accepted): pack-qkv-attention packs every attention and its gradient AND
// fold-matmul-epilogues folds the bias, residual, gelu and bias-gradient ops around the matmuls, including
// the QKV projection whose output attention_qkv reads and whose bias/weight gradients read
// attention_qkv_grad's result. The rewritten step computes what the original does on the CPU backend
// (unsharded and on the rank programs of megatron-tp 2).
#ifdef TPC_HAVE_CUDA

#include <catch2/catch.hpp>

#include <map>

#include "gpt_step_support.h"
#include "worst_error.h"
#include "ir/fusion_group.h"
#include "ir/verifier.h"
#include "runtime/cuda/lowering.h"

using namespace tpc;
using namespace tpc::test;

namespace {

int count(const Graph& g, OpKind op) {
  int k = 0;
  for (const Node* n : g.nodes()) k += n->op() == op;
  return k;
}

// matmul_epilogue nodes by epilogue ("bias+residual" for a bias with a residual operand).
std::map<std::string, int> epilogues(const Graph& g) {
  std::map<std::string, int> m;
  for (const Node* n : g.nodes())
    if (n->op() == OpKind::MatmulEpilogue) ++m[n->getStr("epilogue") + (n->numOperands() == 4 ? "+residual" : "")];
  return m;
}

GptConfig gpt() {
  GptConfig g = smallGpt();
  g.attentionDropout = 0.1;  // attention_qkv draws the same mask
  return g;
}

// The step of gpt() (micro batch 4) through `passes`, then fuse on each rank's program (as `tpc run`).
std::unique_ptr<Graph> fusedStep(const std::string& passes, std::vector<std::unique_ptr<Graph>>* ranks) {
  auto step = gptStep(gpt(), 4, passes);
  *ranks = rankGraphs(*step);
  std::vector<Graph*> programs;
  for (auto& r : *ranks) programs.push_back(r.get());
  if (programs.empty()) programs.push_back(step.get());
  for (Graph* p : programs) REQUIRE(createFusePass()->run(*p).ok());
  return step;
}

// rewriteForCuda: with every epilogue accepted, or none (CudaOptions::matmulEpilogues false); the graph
// stays valid, its fusion groups too.
void rewrite(Graph& g, bool epilogues) {
  std::function<bool(const Node&)> all = [](const Node&) { return true; };
  Status s = cuda::rewriteForCuda(g, epilogues ? all : std::function<bool(const Node&)>());
  INFO((s.ok() ? std::string() : s.error()));
  REQUIRE(s.ok());
  Status v = verifyGraph(g);
  INFO((v.ok() ? std::string() : v.error()));
  REQUIRE(v.ok());
  REQUIRE(fusionGroups(g).ok());
}

struct Counts {
  int attention, attentionGrad, packed, packedGrad, transpose, add, reduceSum, gelu, geluGrad, matmul;
};
Counts counts(const Graph& g) {
  return {count(g, OpKind::Attention), count(g, OpKind::AttentionGrad), count(g, OpKind::AttentionQkv),
          count(g, OpKind::AttentionQkvGrad), count(g, OpKind::Transpose), count(g, OpKind::Add),
          count(g, OpKind::ReduceSum), count(g, OpKind::Gelu), count(g, OpKind::GeluGrad), count(g, OpKind::Matmul)};
}

// The value v is a reshape (or several) of.
const Value* throughReshapes(const Value* v) {
  while (v->def() && v->def()->op() == OpKind::Reshape) v = v->def()->operand(0);
  return v;
}

// Both rewrites fired on every layer of `after` (the step `original` after rewriteForCuda): against
// `original`, every attention is packed; against `unfolded` (the same rewrite without epilogues), the
// epilogues `epi` replace their matmuls, adds, gelus and bias sums.
void checkBoth(const Graph& original, const Graph& unfolded, const Graph& after, const std::map<std::string, int>& epi,
               bool qkvFolded = true) {
  const int layers = static_cast<int>(gpt().layers);
  Counts o = counts(original), u = counts(unfolded), c = counts(after);
  REQUIRE(o.attention == layers);
  // pack-qkv-attention: no attention, its transposes, slices or the zero-padded concat sums left.
  CHECK(c.attention == 0);
  CHECK(c.attentionGrad == 0);
  CHECK(c.packed == layers);
  CHECK(c.packedGrad == layers);
  CHECK(c.transpose == o.transpose - 4 * layers);
  CHECK(c.add <= o.add - 2 * layers);
  // fold-matmul-epilogues: nothing of it without epilogues, all of `epi` with them.
  CHECK(epilogues(unfolded).empty());
  CHECK(epilogues(after) == epi);
  CHECK(c.gelu == 0);
  CHECK(c.geluGrad == 0);
  int folded = 0, biasSums = 0, adds = 0;
  for (const auto& [e, k] : epi) {
    folded += k;
    adds += k * (e == "bias" || e == "gelu_bias" ? 1 : e == "bias+residual" ? 2 : 0);
    biasSums += e == "dgelu_bgrad" || e == "bgrad_b" || e == "bgrad_a" ? k : 0;
  }
  CHECK(c.matmul == u.matmul - folded);
  CHECK(c.reduceSum == u.reduceSum - biasSums);
  CHECK(c.add == u.add - adds);
  CHECK(c.packed == u.packed);
  CHECK(c.transpose == u.transpose);
  // fold-layer-norm-grad-residual: each block's two residual-gradient adds are layer_norm_grad residuals.
  int lnResidual = 0;
  for (const Node* n : after.nodes()) lnResidual += n->op() == OpKind::LayerNormGrad && n->numOperands() == 4;
  CHECK(lnResidual == 2 * layers);
  // The QKV projection is an epilogue node that attention_qkv reads (through a reshape), and its bias
  // gradient a bgrad_a (with the input gradient) that reads attention_qkv_grad's result.
  if (!qkvFolded) return;
  for (const Node* n : after.nodes()) {
    if (n->op() != OpKind::AttentionQkv) continue;
    const Node* qkv = throughReshapes(n->operand(0))->def();
    REQUIRE(qkv);
    CHECK(qkv->op() == OpKind::MatmulEpilogue);
    if (qkv->op() == OpKind::MatmulEpilogue) CHECK(qkv->getStr("epilogue") == "bias");
  }
  int qkvBgrad = 0;
  for (const Node* n : after.nodes()) {
    if (n->op() != OpKind::MatmulEpilogue || n->getStr("epilogue") != "bgrad_a") continue;
    const Node* d = throughReshapes(n->operand(0))->def();
    qkvBgrad += d && d->op() == OpKind::AttentionQkvGrad;
  }
  CHECK(qkvBgrad == layers);
}

// Two steps on the CPU (the mesh backend over `ranks` when given); the loss, grad norm and every parameter.
TensorMap twoSteps(const Graph& global, std::vector<std::unique_ptr<Graph>> ranks) {
  CpuOptions o;
  o.threads = 2;
  o.seed = 11;
  std::unique_ptr<Backend> b = ranks.empty() ? createCpuBackend(o) : createCpuMeshBackend(std::move(ranks), o);
  prepareInitialState(*b, global, 7);
  std::mt19937 rng(5);
  TensorMap out;
  for (int64_t s = 0; s < 2; ++s) {
    auto r = b->step(gptBatch(rng, {4, 16}, 100, 1e-2f, s + 1), s + 1);
    INFO((r.ok() ? std::string() : r.error()));
    REQUIRE(r.ok());
    out = *r;
  }
  return withState(*b, global, std::move(out));
}

// Other weights with near-zero gradients move too (a few 1e-5 after two steps, depending on the initial
// weights), still far below the one update (1e-2) a wrong rewrite gives many of them.
constexpr double kTol = 1e-4;

// The k third of c_attn.bias has a zero gradient in exact arithmetic (softmax ignores a constant added to
// every score of a row): its computed gradient is rounding noise, which AdamW normalises into updates that
// depend on the summation order (the fold's bias sums differ from reduce_sum's). Those entries only have to
// stay far below one real update (lr 1e-2); every other value matches within `tol`.
bool isKeyBias(const std::string& name, int64_t i) {
  const int64_t C = gpt().hidden;
  return name.size() >= 11 && name.compare(name.size() - 11, 11, "c_attn.bias") == 0 && i >= C && i < 2 * C;
}

void checkClose(const TensorMap& want, const TensorMap& got, double tol) {
  REQUIRE(want.size() == got.size());
  for (const auto& [name, w] : want) {
    INFO(name);
    REQUIRE(got.count(name));
    const HostTensor& g = got.at(name);
    REQUIRE(g.numel() == w.numel());
    double worst = 0, scale = 0, noise = 0;
    for (int64_t i = 0; i < w.numel(); ++i) {
      if (isKeyBias(name, i)) {
        noise = test::worseOf(test::worseOf(noise, std::abs(g.getAsDouble(i))), std::abs(w.getAsDouble(i)));
        continue;
      }
      worst = test::worseOf(worst, test::absError(g.getAsDouble(i), w.getAsDouble(i)));
      scale = std::max(scale, std::abs(w.getAsDouble(i)));
    }
    CHECK(worst <= tol * std::max(scale, 1.0));
    CHECK(noise <= 1e-3);
  }
}

// Per layer: QKV + bias; attention and MLP projections + bias + residual; c_fc + bias + gelu; c_fc's input
// gradient with dgelu and c_fc's bias gradient; the bias gradients of c_attn and the attention projection beside
// their input gradients (every candidate accepted: the CUDA backend takes bgrad_a only where its GEMM kernel runs
// it), and c_proj's beside its weight gradient (its input gradient is the dgelu GEMM's).
const std::map<std::string, int> kUnsharded = {{"bias", 2},        {"bias+residual", 4}, {"gelu_bias", 2},
                                               {"dgelu_bgrad", 2}, {"bgrad_a", 4},       {"bgrad_b", 2}};

}  // namespace

TEST_CASE("rewriteForCuda: a GPT step's attentions are packed and its matmul epilogues folded, same step",
          "[cuda][pack-qkv][epilogue]") {
  std::vector<std::unique_ptr<Graph>> none;
  auto g = fusedStep(kTrainPasses, &none);
  auto rewritten = g->clone(), unfolded = g->clone();
  rewrite(*rewritten, true);
  rewrite(*unfolded, false);
  checkBoth(*g, *unfolded, *rewritten, kUnsharded);
  // Nothing is left for either rewrite.
  auto again = rewritten->clone();
  rewrite(*again, true);
  CHECK(again->numNodes() == rewritten->numNodes());
  checkClose(twoSteps(*g, {}), twoSteps(*rewritten, {}), kTol);
}

TEST_CASE("rewriteForCuda: bf16 compute: both rewrites fire, the same step within bf16 rounding",
          "[cuda][pack-qkv][epilogue]") {
  std::vector<std::unique_ptr<Graph>> none;
  auto g = fusedStep("mixed-precision(dtype=bf16)," + kTrainPasses, &none);
  auto rewritten = g->clone(), unfolded = g->clone();
  rewrite(*rewritten, true);
  rewrite(*unfolded, false);
  checkBoth(*g, *unfolded, *rewritten, kUnsharded);
  TensorMap a = twoSteps(*g, {}), b = twoSteps(*rewritten, {});
  for (const char* name : {"loss", "grad_norm"}) {
    INFO(name);
    double x = a.at(name).getAsDouble(0), y = b.at(name).getAsDouble(0);
    CHECK(std::abs(x - y) <= 1e-2 * std::abs(x));
  }
}

// megatron-tp's rank programs read the rank's q, k, v columns as one packed [C, 3*Hl*Dh] matrix again
// (partition's foldStackedQkv), so both rewrites fire as on one rank: the QKV bias add and the bias sum beside
// its input gradient are epilogues. The row-parallel projections add their bias to the partial sum before the
// all_reduce on rank 0 only, with the residual add (all folded); rank 1 holds zeros for both and adds nothing
// (partition's foldZeroShareAdds), so its projections stay plain matmuls.
TEST_CASE("rewriteForCuda: on the rank programs of megatron-tp 2 both rewrites fire and the step matches",
          "[cuda][pack-qkv][epilogue][sharding]") {
  std::vector<std::unique_ptr<Graph>> plain;
  auto g = fusedStep(megatronTp(2) + kTrainPasses, &plain);
  REQUIRE(plain.size() == 2);
  std::vector<std::unique_ptr<Graph>> rewritten;
  for (size_t r = 0; r < plain.size(); ++r) {
    INFO("rank " << r);
    std::map<std::string, int> want = {{"gelu_bias", 2}, {"dgelu_bgrad", 2}, {"bgrad_a", 4}, {"bgrad_b", 2}, {"bias", 2}};
    if (r == 0) want["bias+residual"] = 4;
    auto l = plain[r]->clone(), unfolded = plain[r]->clone();
    rewrite(*l, true);
    rewrite(*unfolded, false);
    checkBoth(*plain[r], *unfolded, *l, want);
    rewritten.push_back(std::move(l));
  }
  checkClose(twoSteps(*g, std::move(plain)), twoSteps(*g, std::move(rewritten)), kTol);
}

// fold-layer-norm-grad-bias-sum (the CUDA backend's canSumLayerNormGradDx accepting every layer_norm_grad): the
// attention projection's and the second MLP matmul's bias gradients, both sums of the backward residual stream,
// are the layer_norm_grads' fourth results: ln_2's for the projection, the next block's ln_1 (or ln_f) for the
// MLP. The step is the same on the CPU backend (its layer_norm_grad sums dx as stored).
TEST_CASE("rewriteForCuda: the layer_norm_grads sum the residual stream's bias gradients and the step matches",
          "[cuda][layer-norm]") {
  std::function<bool(const Node&)> all = [](const Node&) { return true; };
  for (const std::string& passes : {kTrainPasses, "mixed-precision(dtype=bf16)," + kTrainPasses}) {
    INFO(passes);
    std::vector<std::unique_ptr<Graph>> none;
    auto g = fusedStep(passes, &none);
    auto summed = g->clone(), plain = g->clone();
    REQUIRE(cuda::rewriteForCuda(*summed, {}, true, all).ok());
    REQUIRE(cuda::rewriteForCuda(*plain, {}, true).ok());
    Status v = verifyGraph(*summed);
    INFO((v.ok() ? std::string() : v.error()));
    REQUIRE(v.ok());
    const int layers = static_cast<int>(gpt().layers);
    int sums = 0;
    for (const Node* n : summed->nodes()) {
      if (n->op() != OpKind::LayerNormGrad || !n->getBool("sum_dx")) continue;
      ++sums;
      REQUIRE(n->numResults() == 4);
      CHECK(n->result(3)->type() == TensorType(n->result(0)->dtype(), {n->operand(1)->shape().back()}));
    }
    CHECK(sums == 2 * layers);
    CHECK(count(*summed, OpKind::ReduceSum) == count(*plain, OpKind::ReduceSum) - 2 * layers);
    if (passes == kTrainPasses) checkClose(twoSteps(*g, {}), twoSteps(*summed, {}), kTol);
  }
}

// fold-layer-norm-residual (the CUDA backend's TPC_LN_RESIDUAL=1: canAddLayerNormResidual accepting every
// layer_norm): each block's two forward residual adds move into the layer_norm that reads them, ln_2's and the next
// block's ln_1 (or ln_f). With the epilogues folded first, the bias GEMMs that had taken the residual as C give it
// back (no "bias+residual" left, as many more plain "bias"). The step is the same on the CPU backend within bf16
// rounding (the GEMM's output is rounded before the add now, as in the unfolded graph).
TEST_CASE("rewriteForCuda: the layer_norms add the forward residual stream and the step matches", "[cuda][layer-norm]") {
  std::function<bool(const Node&)> all = [](const Node&) { return true; };
  const int layers = static_cast<int>(gpt().layers);
  for (const std::string& passes : {kTrainPasses, "mixed-precision(dtype=bf16)," + kTrainPasses})
    for (bool withEpilogues : {false, true}) {
      INFO(passes << (withEpilogues ? ", epilogues folded" : ", no epilogues"));
      std::vector<std::unique_ptr<Graph>> none;
      auto g = fusedStep(passes, &none);
      auto folded = g->clone(), plain = g->clone();
      std::function<bool(const Node&)> epi = withEpilogues ? all : std::function<bool(const Node&)>();
      REQUIRE(cuda::rewriteForCuda(*folded, epi, true, {}, all).ok());
      REQUIRE(cuda::rewriteForCuda(*plain, epi, true, {}).ok());
      Status v = verifyGraph(*folded);
      INFO((v.ok() ? std::string() : v.error()));
      REQUIRE(v.ok());
      int withResidual = 0;
      for (const Node* n : folded->nodes()) {
        if (n->op() != OpKind::LayerNorm || n->numOperands() != 4) continue;
        ++withResidual;
        REQUIRE(n->numResults() == 2);
        CHECK(n->result(1)->type() == n->operand(0)->type());
        CHECK(n->operand(3)->type() == n->operand(0)->type());
      }
      // Without epilogues the residual adds sit in the fuse pass's groups with the bias adds, which the fold
      // leaves alone (a lone add is folded: the test below).
      CHECK(withResidual == (withEpilogues ? 2 * layers : 0));
      CHECK(count(*folded, OpKind::LayerNorm) == count(*plain, OpKind::LayerNorm));
      if (withEpilogues) {
        std::map<std::string, int> before = epilogues(*plain), after = epilogues(*folded);
        CHECK(before["bias+residual"] == 2 * layers);
        CHECK(after["bias+residual"] == 0);
        CHECK(after["bias"] == before["bias"] + 2 * layers);
      } else {
        CHECK(count(*folded, OpKind::Add) == count(*plain, OpKind::Add) - withResidual);
      }
      // Refused everywhere: nothing changes. With the epilogues folded, also where the bias GEMM without its
      // residual is refused (the backend's epilogue list or cuBLASLt): the GEMMs keep their residual.
      auto refused = g->clone();
      REQUIRE(cuda::rewriteForCuda(*refused, epi, true, {}, [](const Node&) { return false; }).ok());
      for (const Node* n : refused->nodes()) CHECK(!(n->op() == OpKind::LayerNorm && n->numOperands() == 4));
      if (withEpilogues) {
        auto noPlainBias = g->clone();
        std::function<bool(const Node&)> residualOnly = [](const Node& n) {
          return !(n.getStr("epilogue") == "bias" && n.numOperands() == 3);
        };
        REQUIRE(cuda::rewriteForCuda(*noPlainBias, residualOnly, true, {}, all).ok());
        REQUIRE(verifyGraph(*noPlainBias).ok());
        for (const Node* n : noPlainBias->nodes()) CHECK(!(n->op() == OpKind::LayerNorm && n->numOperands() == 4));
        CHECK(epilogues(*noPlainBias)["bias+residual"] == 2 * layers);
      }
      TensorMap a = twoSteps(*g, {}), b = twoSteps(*folded, {});
      if (passes == kTrainPasses) {
        checkClose(a, b, kTol);
        continue;
      }
      for (const char* name : {"loss", "grad_norm"}) {  // bf16: as the epilogue test above
        INFO(name);
        double x = a.at(name).getAsDouble(0), y = b.at(name).getAsDouble(0);
        CHECK(std::abs(x - y) <= 1e-2 * std::abs(x));
      }
    }
}

// fold-layer-norm-residual on a lone add: s = add(t, r) read by a layer_norm and by a later add becomes the
// layer_norm's second result; with a reader of s before the layer_norm, or s a graph output, it stays.
TEST_CASE("fold-layer-norm-residual: a lone residual add moves into the layer_norm that reads it", "[cuda][layer-norm]") {
  for (int variant : {0, 1, 2}) {  // 0: folds; 1: an earlier reader; 2: s is an output
    INFO("variant " << variant);
    Graph g("ln_residual");
    const TensorType x(DType::bf16, {4, 8, 64});
    Value *t = g.addInput("t", x), *r = g.addInput("r", x);
    Value *gamma = g.addInput("gamma", TensorType(DType::f32, {64})), *beta = g.addInput("beta", TensorType(DType::f32, {64}));
    auto s = g.create(OpKind::Add, {t, r});
    REQUIRE(s.ok());
    if (variant == 1) {
      auto early = g.create(OpKind::Neg, {(*s)->result()});
      REQUIRE(early.ok());
      g.addOutput((*early)->result(), "early");
    }
    auto y = g.create(OpKind::LayerNorm, {(*s)->result(), gamma, beta}, attrs({{"eps", 1e-5}}));
    REQUIRE(y.ok());
    auto z = g.create(OpKind::Add, {(*s)->result(), (*y)->result()});
    REQUIRE(z.ok());
    g.addOutput((*z)->result(), "z");
    if (variant == 2) g.addOutput((*s)->result(), "s");
    auto changed = createFoldLayerNormResidualPass()->run(g);
    REQUIRE(changed.ok());
    CHECK(*changed == (variant == 0));
    REQUIRE(verifyGraph(g).ok());
    int withResidual = 0;
    for (const Node* n : g.nodes())
      if (n->op() == OpKind::LayerNorm && n->numOperands() == 4) {
        ++withResidual;
        CHECK(n->operand(0) == t);
        CHECK(n->operand(3) == r);
        CHECK((*z)->operand(0) == n->result(1));  // the later reader takes the layer_norm's sum and y
        CHECK((*z)->operand(1) == n->result(0));
      }
    CHECK(withResidual == (variant == 0 ? 1 : 0));
    CHECK(count(g, OpKind::Add) == (variant == 0 ? 1 : 2));
  }
}

#endif  // TPC_HAVE_CUDA
