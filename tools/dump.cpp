// `tpc dump MODEL.fb|.json [--after=PASS]`: prints a model's graph after a stage of the compile pipeline
// (with no --after: the forward graph, or with --tp/--dp the rank's program after `partition`). Takes the
// same training flags as `tpc run`; with --tp/--dp it prints one rank's partitioned program (--rank), its
// Graphviz form (--format=dot) or its collectives (--summary).
#include <algorithm>
#include <cstdio>
#include <iostream>
#include <map>

#include "frontend/model_file.h"
#include "ir/fusion_group.h"
#include "ir/printer.h"
#include "passes/pipeline.h"
#include "runtime/memory_estimate.h"
#include "tools/cli.h"
#include "tools/compile_pipeline.h"
#include "tools/pipeline_flags.h"
#include "tools/train_flags.h"

namespace tpc {
namespace {

// One line per collective kind and axis: how many per step and the bytes each rank sends into them.
std::string collectiveSummary(const Graph& g) {
  std::map<std::string, std::pair<int64_t, int64_t>> kinds;  // "all_reduce(tp)" -> (count, bytes)
  int64_t total = 0;
  for (const Node* n : g.nodes()) {
    if (!n->has(traits::Collective)) continue;
    std::string key = cat(n->opName(), "(", n->getStr("axis"), n->opName() == "all_reduce" ? ", " + n->getStr("op") : "", ")");
    int64_t b = std::max(n->operand(0)->type().bytes(), n->result()->type().bytes());
    kinds[key].first += 1;
    kinds[key].second += b;
    total += b;
  }
  std::string s = cat("collectives per step (", g.mesh().empty() ? "no mesh" : g.mesh().str(), "):\n");
  if (kinds.empty()) s += "  none\n";
  for (const auto& [k, v] : kinds) s += cat("  ", k, ": ", v.first, " ops, ", v.second, " bytes\n");
  s += cat("  total: ", total, " bytes\n");
  // Under ZeRO-1 (--use-distributed-optimizer): the AdamW moments this rank holds against the whole model's
  // (1/dp, times 1/tp for tp-split params), and the tensors whose moments stay replicated over dp.
  int64_t local = 0, global = 0;
  std::vector<std::string> dpReplicated;
  bool dpSplit = false;
  auto endsWith = [](const std::string& n, const char* suffix) {
    size_t k = std::char_traits<char>::length(suffix);
    return n.size() > k && n.compare(n.size() - k, k, suffix) == 0;
  };
  for (const Value* p : g.params()) {
    const std::string& n = p->name();
    if (!endsWith(n, ".adam_m") && !endsWith(n, ".adam_v")) continue;
    int64_t whole = p->type().numel();
    for (const MeshAxis& a : g.mesh().axes)
      if (p->placement() && p->placement()->get(a.name).isS()) whole *= a.size;
    local += p->type().numel();
    global += whole;
    bool split = p->placement() && p->placement()->get("dp").isS();
    dpSplit |= split;
    if (!split && endsWith(n, ".adam_m")) dpReplicated.push_back(n.substr(0, n.size() - 7));
  }
  if (global > 0 && dpSplit) {
    char frac[32];
    std::snprintf(frac, sizeof frac, "%.2f", double(global) / double(local));
    s += cat("optimizer state on this rank: ", local * 4, " of ", global * 4, " bytes of f32 moments (1/", frac, ")\n");
    for (const std::string& n : dpReplicated)
      s += cat("  moments of ", n, " replicated over dp (no dim that dp divides and tp leaves whole)\n");
  }
  return s;
}

// Graphviz: ops as boxes (collectives filled), params/inputs as ellipses, edges labelled with the type; the
// nodes of one fusion group (the fuse pass's fusion_group=N, one CUDA kernel) share a cluster.
std::string graphToDot(const Graph& g) {
  std::string s = "digraph \"" + g.name() + "\" {\n  node [fontname=\"monospace\", fontsize=10];\n";
  std::map<const Value*, std::string> src;
  auto label = [](const Value* v) {
    std::string l = v->type().str();
    if (v->placement()) l += " " + v->placement()->str();
    return l;
  };
  int k = 0;
  for (const Value* v : g.inputs()) {
    src[v] = cat("a", k++);
    s += cat("  ", src[v], " [shape=ellipse, label=\"%", v->name(), "\"];\n");
  }
  for (const Value* v : g.params()) {
    src[v] = cat("a", k++);
    s += cat("  ", src[v], " [shape=ellipse, style=dashed, label=\"%", v->name(), "\"];\n");
  }
  int i = 0;
  std::map<int64_t, std::vector<std::string>> groups;  // fusion group -> its nodes' ids
  for (const Node* n : g.nodes()) {
    std::string id = cat("n", i++);
    bool coll = n->has(traits::Collective);
    int64_t group = fusionGroupOf(*n);
    if (group >= 0) groups[group].push_back(id);
    s += cat("  ", id, " [shape=box", coll ? ", style=filled, fillcolor=\"#f4b942\"" : "", ", label=\"", n->opName(),
             coll ? "(" + n->getStr("axis") + ")" : "", group >= 0 ? cat("\\nfusion_group=", group) : "", "\"];\n");
    for (const Value* o : n->operands())
      if (src.count(o)) s += cat("  ", src[o], " -> ", id, " [label=\"", label(o), "\"];\n");
    for (const Value* r : n->results()) src[r] = id;
  }
  for (size_t o = 0; o < g.outputs().size(); ++o) {
    s += cat("  out", o, " [shape=ellipse, label=\"", g.outputName(o), "\"];\n");
    if (src.count(g.outputs()[o].value)) s += cat("  ", src[g.outputs()[o].value], " -> out", o, ";\n");
  }
  for (const auto& [group, ids] : groups) {
    s += cat("  subgraph cluster_fusion_", group, " {\n    label=\"fusion_group=", group,
             "\";\n    style=\"dashed,rounded\";\n    color=\"#3a7bd5\";\n   ");
    for (const std::string& id : ids) s += " " + id + ";";
    s += "\n  }\n";
  }
  return s + "}\n";
}

// --passes runs its list as given, so the flags that only shape the standard pipeline would be ignored without a
// word: each is refused, naming the pass that does its work. --tp/--dp also size the graph (vocab padding, the
// batch of all dp ranks), which the list's own megatron-tp(tp=N)/data-parallel(dp=N) need, so they stay with those.
// The optimizer's flags become options of autodiff and data-parallel (`accum` is the micro-batches per step that
// --global-batch-size makes); each stays where the list gives its pass the same value, which is then in effect.
Status refuseFlagsPassesIgnores(const cli::Flags& flags, const std::vector<PipelineEntry>& entries, const TrainConfig& c,
                                int64_t accum) {
  auto listHas = [&](const char* key, int64_t n) {
    return std::any_of(entries.begin(), entries.end(),
                       [&](const PipelineEntry& e) { return e.options.getString(key, "") == std::to_string(n); });
  };
  // Whether a `pass` of the list has option `key`, read as its factory reads it, equal to `want`.
  auto passSets = [&](const char* pass, const char* key, auto read, auto want) {
    return std::any_of(entries.begin(), entries.end(), [&](const PipelineEntry& e) {
      if (e.name != pass || !e.options.has(key)) return false;
      auto v = read(e.options, key);
      return v.ok() && *v == want;
    });
  };
  auto readFloat = [](const PassOptions& o, const char* key) { return o.getFloat(key, 0); };
  const char* fix = ", or drop --passes";
  if (flags.has("rank"))
    return makeError("--rank ", flags.get("rank"), " is ignored with --passes; give the rank in the list, partition(rank=",
                     flags.get("rank"), ")", fix);
  for (const char* f : {"no-fuse", "no-fuse-classifier"})
    if (flags.on(f)) return makeError("--", f, " is ignored with --passes (it edits the standard pipeline); leave the pass out of --passes", fix);
  if (c.precision == "bf16" || c.precision == "fp16") {
    std::string flag = flags.on("bf16") ? "--bf16" : flags.on("fp16") ? "--fp16" : flags.has("precision") ? "--precision " + c.precision : "";
    if (!flag.empty())
      return makeError(flag, " is ignored with --passes; put mixed-precision(dtype=", c.precision == "bf16" ? "bf16" : "f16",
                       ") before autodiff in --passes", c.precision == "fp16" ? " and loss-scale=true in autodiff's options" : "", fix);
  }
  if (flags.has("recompute") && c.recompute != "none")
    return makeError("--recompute ", c.recompute, " is ignored with --passes; put recompute(mode=", c.recompute,
                     ") after autodiff in --passes", fix);
  if (flags.on("sp")) return makeError("--sp is ignored with --passes; put sequence-parallel after the tp policy in --passes", fix);
  const std::string policy = flags.get("sharding-policy");
  if (flags.has("sharding-policy") &&
      std::none_of(entries.begin(), entries.end(), [&](const PipelineEntry& e) { return e.name == policy; }))
    return makeError("--sharding-policy=", policy, " is ignored with --passes; put ", policy, "(tp=N) in --passes", fix);
  if (flags.has("tp") && c.tp > 1 && !listHas("tp", c.tp))
    return makeError("--tp ", c.tp, " with --passes only pads the vocabulary, it does not shard; put the policy in --passes "
                     "(megatron-tp(tp=", c.tp, ") ... partition(rank=R))", fix);
  if (flags.has("dp") && c.dp > 1 && !listHas("dp", c.dp))
    return makeError("--dp ", c.dp, " with --passes only multiplies the batch, it does not shard; put data-parallel(dp=",
                     c.dp, ") after autodiff in --passes", fix);
  struct OptimizerFlag {
    const char *flag, *option;
    double value;
  };
  const OptimizerFlag optimizer[] = {{"clip-grad", "clip-grad", c.clipGrad}, {"weight-decay", "weight-decay", c.weightDecay},
                                     {"adam-beta1", "beta1", c.beta1}, {"adam-beta2", "beta2", c.beta2},
                                     {"adam-eps", "eps", c.eps}};
  for (const OptimizerFlag& o : optimizer)
    if (flags.has(o.flag) && !passSets("autodiff", o.option, readFloat, o.value))
      return makeError("--", o.flag, " ", flags.get(o.flag), " is ignored with --passes; put ", o.option, "=",
                       flags.get(o.flag), " in autodiff's options in --passes", fix);
  auto readInt = [](const PassOptions& o, const char* key) { return o.getInt(key, 0); };
  if (flags.has("global-batch-size") && !passSets("autodiff", "accum", readInt, accum))
    return makeError("--global-batch-size ", c.globalBatch, " is ignored with --passes (it makes ", accum,
                     " micro-batches per step); put accum=", accum, " in autodiff's options in --passes", fix);
  auto readBool = [](const PassOptions& o, const char* key) { return o.getBool(key, false); };
  if (flags.on("use-distributed-optimizer") && !passSets("data-parallel", "zero1", readBool, true))
    return makeError("--use-distributed-optimizer is ignored with --passes; put zero1=true in data-parallel's options in "
                     "--passes (data-parallel(dp=", c.dp > 1 ? std::to_string(c.dp) : "N", ", zero1=true) after autodiff)", fix);
  return {};
}

int runDump(std::vector<std::string> args) {
  cli::Flags flags("dump", "tpc dump MODEL.fb|MODEL.json [--after=PASS] [training flags]");
  flags.value("after", "print the graph after this pass of the pipeline (default: the forward graph, with --tp/--dp "
                       "the rank's program after partition; with --passes, --summary or --memory: the last pass)")
      .value("passes", "the pipeline to run instead of the standard one")
      .toggle("print-pipeline", "print the pipeline that would run and exit")
      .value("rank", "with --tp/--dp: the rank whose program `partition` builds", "0")
      .value("format", "text | dot (Graphviz)", "text")
      .toggle("no-fuse", "leave out the fuse pass that ends the standard pipeline (the CUDA backend's fusion groups)")
      .toggle("no-fuse-classifier", "leave out the fuse-classifier pass before fuse (the CUDA backend's fused loss and gradient)")
      .toggle("summary", "list the collectives of one step by kind, with their bytes, instead of the graph")
      .toggle("memory", "print the planned memory of one rank's step (the whole pipeline, or up to --after)");
  cli::declareTrainingFlags(flags);
  cli::declarePipelineFlags(flags);
  int rc = 0;
  if (!flags.parse(args, rc)) return rc;
  if (flags.positional().size() != 1) return cli::fail("dump", "expected one model file (.fb or .json)");
  auto model = loadModelFile(flags.positional()[0]);
  if (!model) return cli::fail("dump", model.error());
  if (Status s = cli::applyTrainingFlags(flags, model->config); !s.ok()) return cli::fail("dump", s.error());
  // The early checks against the model's heads and sequence are for the standard pipeline, not --passes.
  const GptConfig* gpt = model->gpt && !flags.has("passes") ? &*model->gpt : nullptr;
  if (Status s = cli::validateTrainingFlags(flags, model->config, gpt); !s.ok()) return cli::fail("dump", s.error());
  auto tpPolicy = cli::applyPipelineFlags(flags, model->config, PassRegistry::global(), gpt);
  if (!tpPolicy) return cli::fail("dump", tpPolicy.error());
  if (Status s = matchBatchShape(*model, flags.positional()[0]); !s.ok()) return cli::fail("dump", s.error());
  auto accum = accumulationSteps(model->config);
  if (!accum) return cli::fail("dump", accum.error());
  auto rank = flags.getInt("rank", 0, 1 << 20);
  if (!rank) return cli::fail("dump", rank.error());
  const TrainConfig& c = model->config;
  if (*rank > 0 && c.tp == 1 && c.dp == 1 && !flags.has("passes"))
    return cli::fail("dump", cat("--rank ", *rank, ": the step is not sharded, so it has rank 0 alone; give --tp/--dp to "
                                 "shard it, or drop --rank"));
  std::string format = flags.get("format");
  if (format != "text" && format != "dot") return cli::fail("dump", "--format=" + format + ": expected text or dot");
  for (const char* text : {"summary", "memory", "print-pipeline"})  // these print text, never a graph
    if (format == "dot" && flags.on(text))
      return cli::fail("dump", cat("--format dot and --", text, " exclude each other: --", text,
                                   " prints text, not a graph; drop one"));
  // The standard pipeline ends with fuse-classifier and fuse, as `tpc run` compiles it for the CUDA backend.
  std::string pipeline = flags.has("passes") ? flags.get("passes")
                                             : standardPipeline(*model, *accum, *rank, *tpPolicy) +
                                                   (flags.on("no-fuse-classifier") ? "" : ",fuse-classifier") +
                                                   (flags.on("no-fuse") ? "" : ",fuse");
  // The standard pipeline is tpc's own text: its errors (a plugin policy's factory) have no place in --passes.
  auto entries = parsePipeline(pipeline, flags.has("passes") ? "--passes" : "");
  if (!entries) return cli::fail("dump", entries.error());
  if (PassManager check; flags.has("passes")) {  // unknown passes and bad options, before anything prints
    if (Status s = check.addEntries(*entries); !s.ok()) return cli::fail("dump", s.error());
    if (Status s = refuseFlagsPassesIgnores(flags, *entries, c, *accum); !s.ok()) return cli::fail("dump", s.error());
  }
  // After the refusals: a flag --passes refuses is one error, not a warning that it does nothing and the error.
  cli::warnIneffectiveFlags("dump", flags, c);
  if (flags.on("print-pipeline")) {
    std::cout << pipeline << "\n";
    return 0;
  }
  std::string after = flags.get("after");
  // --memory, --summary and --passes mean the pipeline's output (all of it), unless --after names a pass.
  const bool whole = after.empty() && (flags.on("memory") || flags.on("summary") || flags.has("passes")) && !entries->empty();
  if (whole) after = entries->back().name;
  // Under --tp/--dp the pipeline partitions: show the rank's program, which also checks the sharding (a tp
  // that does not divide the heads is an error here as in `tpc run`, not an unsharded graph).
  auto partition = std::find_if(entries->begin(), entries->end(), [](const PipelineEntry& e) { return e.name == "partition"; });
  if (after.empty() && partition != entries->end()) after = "partition";
  // Before partition the graph is the whole step, the same for every rank.
  auto shown = std::find_if(entries->begin(), entries->end(), [&](const PipelineEntry& e) { return e.name == after; });
  if (flags.has("rank") && partition != entries->end() && shown < partition)
    return cli::fail("dump", cat("--rank ", *rank, " has no effect at --after=", after, ": the rank's program exists from "
                                 "partition on; give --after=partition or a later pass, or drop --rank"));
  if (after.empty()) {
    std::cout << (format == "dot" ? graphToDot(*model->forward) : printGraph(*model->forward));
    return 0;
  }
  // Run the pipeline up to and including the first pass named `after`.
  std::vector<PipelineEntry> prefix;
  for (const PipelineEntry& e : *entries) {
    prefix.push_back(e);
    if (e.name == after && !whole) break;
  }
  if (prefix.back().name != after) {
    std::string names;
    for (const PipelineEntry& e : *entries) names += (names.empty() ? "" : ", ") + e.name;
    return cli::fail("dump", "--after=" + after + ": not a pass of the pipeline (" + names + ")");
  }
  PassManager pm;
  if (Status s = pm.addEntries(prefix); !s.ok()) return cli::fail("dump", s.error());
  if (Status s = pm.run(*model->forward); !s.ok())
    return cli::fail("dump", cat(flags.positional()[0], ": ", s.error()));  // as tpc run names it
  if (flags.on("summary")) std::cout << collectiveSummary(*model->forward);
  if (flags.on("memory")) {
    MemoryEstimate m = estimateMemory(*model->forward);
    std::cout << "memory of one rank's step after " << after << " (values live from their node to their last reader):\n"
              << "  parameters + optimizer state  " << formatBytes(m.stateBytes) << "\n"
              << "  inputs                        " << formatBytes(m.inputBytes) << "\n"
              << "  peak activations              " << formatBytes(m.peakActivationBytes)
              << (m.peakAt ? " (during " + std::string(m.peakAt->opName()) + ")" : std::string()) << "\n"
              << "  planned peak                  " << formatBytes(m.total()) << "\n";
  }
  if (flags.on("summary") || flags.on("memory")) return 0;
  if (format == "dot") std::cout << graphToDot(*model->forward);
  else std::cout << printGraph(*model->forward);
  return 0;
}

cli::SubcommandRegistration reg("dump", "print a model's graph after a stage of the compile pipeline", runDump);

}  // namespace
}  // namespace tpc
