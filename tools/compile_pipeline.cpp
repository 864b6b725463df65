// The standard compile pipeline.
#include "tools/compile_pipeline.h"

#include <algorithm>

#include "ir/attr.h"
#include "ir/printer.h"
#include "models/gpt.h"

namespace tpc {

Result<int64_t> accumulationSteps(const TrainConfig& c) {
  if (c.globalBatch % (c.microBatch * c.dp) != 0)
    return makeError("--global-batch-size=", c.globalBatch, " is not a multiple of --micro-batch-size=", c.microBatch,
                     " x --dp=", c.dp);
  return c.globalBatch / (c.microBatch * c.dp);
}

namespace {

// The shapes of a graph's attention operands, sorted: what its heads and head size make of q, k and v.
std::vector<std::string> attentionShapes(const Graph& g) {
  std::vector<std::string> out;
  for (const Node* n : g.nodes())
    if (n->op() == OpKind::Attention || n->op() == OpKind::AttentionQkv)
      for (const Value* v : n->operands()) out.push_back(v->type().str());
  std::sort(out.begin(), out.end());
  return out;
}

// A model file's graph and its arch block must describe one model: a run that keeps the graph trains the
// graph's, one that rebuilds it (another batch, sequence or tp) trains arch's. Compared at the graph's own
// batch: the parameters (names and shapes), the attention operands (heads), then the whole printed graph.
Status checkGraphMatchesArch(const ModelFile& model, const Value* tokens, const std::string& path) {
  GptConfig gpt = *model.gpt;
  // A tp run pads wte's rows to a multiple of 128 x tp (matchBatchShape), and its checkpoints' model file keeps that
  // graph beside the arch it was built from: arch is built here with the graph's rows.
  for (const Value* p : model.forward->params())
    if (p->name() == "wte" && p->type().rank() == 2 && p->shape()[1] == gpt.hidden && p->shape()[0] >= gpt.vocab)
      gpt.paddedVocab = p->shape()[0];
  TrainConfig bc = model.config;
  bc.microBatch = bc.globalBatch = tokens->shape()[0];
  bc.seqLength = tokens->shape()[1];
  bc.dp = bc.tp = 1;
  bc.sp = false;
  auto rebuilt = buildGpt(gpt, bc);
  if (!rebuilt.ok()) return {};  // arch itself is checked, with its own message, where a run rebuilds from it
  auto params = [](const Graph& g) {
    std::vector<std::pair<std::string, Shape>> out;
    for (const Value* p : g.params()) out.push_back({p->name(), p->shape()});
    return out;
  };
  auto have = params(*model.forward), want = params(*rebuilt->forward);
  std::string diff;
  for (size_t i = 0; i < std::max(have.size(), want.size()) && diff.empty(); ++i) {
    if (i >= have.size()) diff = cat("arch implies parameter ", want[i].first, ", which the graph lacks");
    else if (i >= want.size()) diff = cat("the graph's parameter ", have[i].first, " is not in arch's model");
    else if (have[i].first != want[i].first) diff = cat("parameter ", i, " is ", have[i].first, " in the graph, ", want[i].first, " in arch's model");
    else if (have[i].second != want[i].second)
      diff = cat("parameter ", have[i].first, " is ", TensorType(DType::f32, have[i].second).str(), " in the graph, ",
                 TensorType(DType::f32, want[i].second).str(), " in arch's model");
  }
  if (diff.empty() && attentionShapes(*model.forward) != attentionShapes(*rebuilt->forward))
    diff = "the graph's attention splits the hidden size into other heads than arch.heads";
  if (diff.empty()) {
    // The rest of the graph too (ops, attributes such as dropout, eps and init): a run that rebuilds the graph from
    // arch (another tp, batch or sequence) would otherwise train another model than the one a tp 1 run trains.
    const std::string haveText = printGraph(*model.forward), wantText = printGraph(*rebuilt->forward);
    if (haveText != wantText) {
      size_t at = 0, line = 1;
      for (; at < haveText.size() && at < wantText.size() && haveText[at] == wantText[at]; ++at) line += haveText[at] == '\n';
      // The differing line of each text, trimmed: "%2 = layer_norm(...) {eps=1e-05} : f32[8,64,128]".
      auto lineAt = [&](const std::string& t) {
        const size_t b = at == 0 ? 0 : t.rfind('\n', at - 1) + 1, e = std::min(t.find('\n', at), t.size());
        std::string l = t.substr(b, e - b);
        l.erase(0, l.find_first_not_of(' '));
        return l.size() > 160 ? l.substr(0, 157) + "..." : l;
      };
      diff = cat("line ", line, " of the printed graph is '", lineAt(haveText), "' where arch builds '", lineAt(wantText),
                 "' (a run that rebuilds the graph from arch, at another --tp, batch or sequence, would train arch's)");
    }
  }
  if (diff.empty()) return {};
  return makeError(path, ": error: the graph does not match the file's arch block (arch.layers=", gpt.layers, ", arch.hidden=",
                   gpt.hidden, ", arch.heads=", gpt.heads, "): ", diff, "; write the file again with 'tpc new' or fix arch");
}

}  // namespace

Status matchBatchShape(ModelFile& model, const std::string& path) {
  const TrainConfig& c = model.config;
  const Value* tokens = nullptr;
  for (const Value* v : model.forward->inputs())
    if (v->name() == "tokens") tokens = v;
  if (model.gpt && tokens && tokens->type().rank() == 2) TPC_TRY(checkGraphMatchesArch(model, tokens, path));
  // The global graph holds the batch of every dp rank: data-parallel splits it again.
  const int64_t batch = c.microBatch * c.dp;
  bool vocabOk = true;
  int64_t wteRows = 0;
  for (const Value* p : model.forward->params())
    if (p->name() == "wte" && c.tp > 1) vocabOk = (wteRows = p->shape()[0]) % (128 * c.tp) == 0;
  const bool shapeOk = tokens && tokens->type().rank() == 2 && tokens->shape()[0] == batch && tokens->shape()[1] == c.seqLength;
  if (shapeOk && vocabOk) return {};
  if (!model.gpt && shapeOk)
    return makeError(path, ": error: --tp ", c.tp, " splits wte's ", wteRows, " rows over the ranks, which needs a multiple of "
                     "128 x tp = ", 128 * c.tp, "; this model file has no architecture record to pad it from (write it "
                     "with 'tpc new', or run a tp whose 128 x tp divides ", wteRows, ")");
  if (!model.gpt)
    return makeError(path, ": error: the graph's %tokens is ", tokens ? tokens->type().str() : "missing",
                     " but the run asks for [", batch, ",", c.seqLength, "]",
                     c.dp > 1 ? cat(" (micro batch ", c.microBatch, " x dp ", c.dp, ")") : std::string(),
                     "; this model file has no architecture record to rebuild it from");
  GptConfig gpt = *model.gpt;
  // Under tp the vocab is split over the ranks: pad it to a multiple of 128 x tp.
  if (c.tp > 1) {
    int64_t unit = 128 * c.tp;
    gpt.paddedVocab = (std::max(gpt.vocab, gpt.resolvedPaddedVocab()) + unit - 1) / unit * unit;
  }
  // The rebuilt graph is the step of one micro batch over all dp ranks (data-parallel splits it later):
  // as a config on its own that is dp 1 with one micro batch per step, or the batch check would ask for
  // a global batch of micro x dp x dp.
  TrainConfig bc = c;
  bc.microBatch = batch;
  bc.globalBatch = batch;
  bc.dp = 1;
  TPC_ASSIGN(ModelFile rebuilt, buildGpt(gpt, bc));
  model.forward = std::move(rebuilt.forward);
  return {};
}

std::string standardPipeline(const ModelFile& model, int64_t accum, std::optional<int64_t> partitionRank,
                             const std::string& tpPolicy) {
  const TrainConfig& c = model.config;
  // Policies that rewrite or annotate the forward graph run before autodiff; data-parallel after it (it
  // splits the batch dim of the inputs, which autodiff prefixes with [accum]); the engine last.
  std::string pre, post;
  // sp splits the sequence over the tp ranks: with tp 1 there is nothing to split (--sp warns so), and the
  // policy would only add gathers and scatters over one rank.
  if (c.tp > 1) pre += cat(tpPolicy, "(tp=", c.tp, "),");
  if (c.sp && c.tp > 1) pre += "sequence-parallel,";
  // "auto" means fp32 here; `tpc run` resolves it to bf16 when it trains on the GPU.
  if (c.precision == "bf16") pre += "mixed-precision(dtype=bf16),";
  if (c.precision == "fp16") pre += "mixed-precision(dtype=f16),";
  if (c.dp > 1) post += cat(",data-parallel(dp=", c.dp, c.distributedOptimizer ? ", zero1=true" : "", ")");
  if (partitionRank && (c.tp > 1 || c.dp > 1)) post += cat(",partition(rank=", *partitionRank, ")");
  return pre + cat("autodiff(loss=", model.lossOutput, ", accum=", accum, ", clip-grad=", formatFloat(c.clipGrad),
             ", beta1=", formatFloat(c.beta1), ", beta2=", formatFloat(c.beta2), ", eps=", formatFloat(c.eps),
             ", weight-decay=", formatFloat(c.weightDecay), c.precision == "fp16" ? ", loss-scale=true" : "", "),cse,dce") +
         ",fold-vocab-padding" +
         (c.recompute == "none" ? std::string() : cat(",recompute(mode=", c.recompute, ")")) + post;
}

std::string evaluationPipeline(const ModelFile& model, const std::string& precision, const std::string& tpPolicy) {
  const TrainConfig& c = model.config;
  std::vector<std::string> passes;
  if (c.tp > 1) passes.push_back(cat(tpPolicy, "(tp=", c.tp, ")"));
  if (c.sp && c.tp > 1) passes.push_back("sequence-parallel");  // as the training step: none at tp 1
  // cse merges the per-use casts mixed-precision adds (the tied embedding's two).
  if (precision == "bf16") passes.insert(passes.end(), {"mixed-precision(dtype=bf16)", "cse"});
  // As in the training step: the loss reads the padded logits in place, without a copy of them sliced to the
  // vocabulary (1.4 GiB of gpt2-medium's evaluation at micro batch 16).
  passes.insert(passes.end(), {"dce", "fold-vocab-padding"});
  if (c.dp > 1) passes.push_back(cat("data-parallel(dp=", c.dp, ")"));
  std::string out;
  for (const std::string& p : passes) out += (out.empty() ? "" : ",") + p;
  return out;
}

}  // namespace tpc
