// `tpc sample --load DIR --prompt "..."`: text generation from a checkpoint with the model's tokenizer,
// streaming tokens as they come; temperature 0 is greedy decoding. One forward graph of a fixed window
// [1, T] (T: prompt + new tokens, at most the position table) is built once and run for every token, on
// the GPU or the CPU: the context sits at the front of the window and the logits of its last position are
// read; causal attention keeps the padding after it from changing them. `--window grow` is the reference
// it is tested against: a graph rebuilt for each context length, CPU only.
#include <algorithm>
#include <cmath>
#include <iostream>
#include <optional>
#include <random>

#include "frontend/model_file.h"
#include "frontend/tokenizer.h"
#include "frontend/unicode_classes.h"
#include "models/gpt.h"
#include "models/sampling.h"
#include "passes/builtin_passes.h"
#include "runtime/backend_select.h"
#include "runtime/checkpoint.h"
#include "runtime/cpu/cpu_executor.h"
#ifdef TPC_HAVE_CUDA
#include "runtime/cuda/cuda_backend.h"
#endif
#include "runtime/safetensors.h"
#include "tools/cli.h"
#include "tools/output_paths.h"

namespace tpc {
namespace {

// The forward graph of `gpt` for one sequence of `len` tokens, returning logits [1, len, vocab].
Result<std::unique_ptr<Graph>> logitsGraph(const GptConfig& gpt, const TrainConfig& base, int64_t len) {
  TrainConfig c = base;
  c.microBatch = c.globalBatch = 1;
  c.seqLength = len;
  c.dp = c.tp = 1;
  c.sp = false;
  GptConfig g = gpt;
  g.hiddenDropout = g.attentionDropout = 0;  // inference
  TPC_ASSIGN(ModelFile m, buildGpt(g, c));
  Value* logits = nullptr;
  for (Node* n : m.forward->nodes())
    for (Value* r : n->results())
      if (r->hasName() && r->name() == "logits") logits = r;
  if (!logits) return makeError("the GPT graph has no value named logits");
  m.forward->clearOutputs();
  m.forward->addOutput(logits, "logits");
  TPC_TRY(createDCEPass()->run(*m.forward).status());
  return std::move(m.forward);
}

int runSample(std::vector<std::string> args) {
  cli::Flags flags("sample",
                   "tpc sample --load CHECKPOINT [--prompt TEXT] [--max-tokens N] [--temperature T] [--top-k K] [--top-p P]\n"
                   "           [--seed S]\n\n"
                   "Generates text from a checkpoint (a --save directory or one of its iter_N directories) with the\n"
                   "model's tokenizer, printing tokens as they come. The model sees at most its position table's\n"
                   "length (n_positions) of context: past it, each new token is predicted from the last n_positions\n"
                   "tokens (a sliding window), and a longer prompt is cut to its end, with a note on stderr.\n"
                   "--dump-logits FILE writes the prompt's logits [tokens, vocab] and its ids [tokens] as safetensors\n"
                   "(tensors 'logits' and 'tokens'), for comparison with another implementation. Sampling stops at\n"
                   "--max-tokens or at a generated end-of-document token (<|endoftext|>), whichever comes first.\n"
                   "The next token is drawn as Hugging Face's generate draws it: logits / --temperature, then the\n"
                   "--top-k most likely, then of those the fewest most likely whose probability reaches --top-p.");
  flags.value("load", "the checkpoint to sample from")
      .value("prompt", "the text to continue (empty: start from the end-of-document token)", "")
      .value("max-tokens", "tokens to generate", "64")
      .value("temperature", "softmax temperature; 0: greedy (always the most likely token)", "1.0")
      .value("top-k", "sample among the K most likely tokens only (and those tied with the K-th, as Hugging Face keeps them); 0: all", "0")
      .value("top-p", "nucleus sampling: among the fewest most likely tokens whose probability reaches P, "
                      "in (0, 1]; 1: all", "1.0")
      .value("seed", "random seed of the sampler", "1234")
      .value("threads", "CPU threads (0: all cores)", "0")
      .value("backend", "auto | cpu | cuda (auto: the GPU when there is one)", "auto")
      .value("window", "fixed: one graph of [1, prompt + max-tokens] run for every token | grow: a graph per "
                       "context length (the CPU reference fixed is tested against)", "fixed")
      .value("dump-logits", "write the prompt's logits to this safetensors file")
      .toggle("ignore-eod", "go on past a generated end-of-document token (by default sampling stops there, as "
                            "Hugging Face's generate and Megatron-LM's do)");
  int rc = 0;
  if (!flags.parse(args, rc)) return rc;
  if (!flags.positional().empty())
    return cli::fail("sample", "unexpected argument '" + flags.positional()[0] + "' (the text to continue goes in --prompt)");
  if (!flags.has("load")) return cli::fail("sample", "--load CHECKPOINT is required");
  auto maxTokens = flags.getInt("max-tokens", 0, 1 << 20);
  auto topK = flags.getInt("top-k", 0, 1 << 30);
  auto seed = flags.getInt("seed", 0, std::numeric_limits<long long>::max());
  auto temperature = flags.getDouble("temperature");
  auto threads = flags.getInt("threads", 0, 1024);
  for (const Status& s : {maxTokens.status(), topK.status(), seed.status(), temperature.status(), threads.status()})
    if (!s.ok()) return cli::fail("sample", s.error());
  if (!(*temperature >= 0) || !std::isfinite(*temperature))
    return cli::fail("sample", "--temperature must be a finite number >= 0 (0: greedy), got " + flags.get("temperature"));
  auto topP = flags.getDouble("top-p");
  if (!topP || !(*topP > 0 && *topP <= 1))  // NaN fails both comparisons
    return cli::fail("sample", "--top-p must be a number in (0, 1] (1: off), got '" + flags.get("top-p") + "'");
  const std::string window = flags.get("window");
  if (window != "fixed" && window != "grow")
    return cli::fail("sample", "--window=" + window + " is not a window mode (expected fixed or grow)");
  auto backendKind = selectBackend(flags.get("backend"));
  if (!backendKind) return cli::fail("sample", backendKind.error());
  if (window == "grow" && *backendKind == BackendKind::Cuda && flags.get("backend") == "cuda")
    return cli::fail("sample", "--window grow runs on the CPU only (a graph per length); use --window fixed with --backend cuda");
  if (window == "grow") backendKind = BackendKind::Cpu;

  auto ck = loadCheckpoint(flags.get("load"));
  if (!ck) return cli::fail("sample", ck.error());
  if (flags.has("dump-logits")) {  // before the work, and never into the checkpoint being read
    const std::string out = flags.get("dump-logits");
    if (Status s = cli::checkOutputFile("--dump-logits", out); !s.ok()) return cli::fail("sample", s.error());
    if (cli::insideFolder(out, flags.get("load")) || cli::insideFolder(out, ck->path))
      return cli::fail("sample", cat("--dump-logits ", out, " is inside the checkpoint --load reads (", ck->path,
                                     "): pick a file outside it"));
  }
  auto model = loadModelFile(ck->path + "/model.fb");
  if (!model) return cli::fail("sample", model.error());
  if (!model->gpt) return cli::fail("sample", ck->path + "/model.fb: error: not a GPT model; tpc samples GPT models");
  const GptConfig& gpt = *model->gpt;
  auto tokenizer = loadTokenizer(model->config.tokenizer);
  if (!tokenizer) return cli::fail("sample", tokenizer.error());
  if ((*tokenizer)->vocabSize() > gpt.vocab)
    return cli::fail("sample", cat(ck->path, "/model.fb: error: the ", model->config.tokenizer, " tokenizer's ",
                                   (*tokenizer)->vocabSize(), " ids do not fit arch.vocab=", gpt.vocab,
                                   " (tokenizer_type and arch.vocab disagree); write the model with tpc new"));
  // Only ids the tokenizer can decode are drawn: a vocabulary larger than the tokenizer's has rows no text maps to.
  const int32_t choices = (*tokenizer)->vocabSize();

  // Parameters, in the graph's layout (the embedding padded to its rows).
  auto first = logitsGraph(gpt, model->config, 1);
  if (!first) return cli::fail("sample", first.error());
  std::vector<HostTensor> params;
  for (const Value* p : (*first)->params()) {
    Shape layout = gptStoredShape(gpt, p->name(), p->shape());
    auto t = checkpointTensor(*ck, p->name(), layout, p->type());
    if (!t) return cli::fail("sample", t.error());
    // A NaN or infinite weight makes every logit NaN, and the sampler would then print one id over and over.
    if (t->dtype() == DType::f32)
      if (Status s = requireFiniteWeights(*t, ck->path + "/model.safetensors", p->name(),
                                          "a model with non-finite weights cannot be sampled");
          !s.ok())
        return cli::fail("sample", s.error());
    params.push_back(std::move(*t));
  }

  std::vector<int32_t> ids;
  if (Status s = (*tokenizer)->encode(flags.get("prompt"), ids); !s.ok())
    return cli::fail("sample", cat("--prompt: ", s.error()));
  if (ids.empty()) ids.push_back((*tokenizer)->eod());
  if (static_cast<int64_t>(ids.size()) > gpt.positions)
    std::cerr << "note: the prompt is " << ids.size() << " tokens, longer than the model's " << gpt.positions
              << " positions; it continues from the last " << gpt.positions << "\n";
  CpuOptions cpu;
  cpu.threads = static_cast<int>(*threads);
  // The fixed window: long enough for the prompt and every new token, never longer than the position table.
  const int64_t fixedLen =
      std::max<int64_t>(1, std::min<int64_t>(static_cast<int64_t>(ids.size()) + *maxTokens, gpt.positions));
  std::unique_ptr<Graph> fixedGraph;
  std::unique_ptr<CpuExecutor> fixedCpu;
  std::unique_ptr<Backend> fixedGpu;
  if (window == "fixed") {
    auto g = logitsGraph(gpt, model->config, fixedLen);
    if (!g) return cli::fail("sample", g.error());
    fixedGraph = std::move(*g);
#ifdef TPC_HAVE_CUDA
    if (*backendKind == BackendKind::Cuda) {
      CudaOptions options;
      options.verbose = false;
      fixedGpu = createCudaBackend({}, options);
      TensorMap state;
      for (size_t k = 0; k < params.size(); ++k) state[fixedGraph->params()[k]->name()] = params[k];
      if (Status s = fixedGpu->prepare(*fixedGraph, state); !s.ok()) return cli::fail("sample", s.error());
    }
#endif
    if (!fixedGpu) {
      auto e = CpuExecutor::create(*fixedGraph, cpu);
      if (!e) return cli::fail("sample", e.error());
      fixedCpu = std::move(*e);
    }
  }
  int64_t calls = 0;
  // Logits [len, vocab] of the last `len` context tokens (len <= the window in fixed mode).
  auto forward = [&](int64_t len) -> Result<HostTensor> {
    if (window == "grow") {
      TPC_ASSIGN(auto g, logitsGraph(gpt, model->config, len));
      TPC_ASSIGN(auto exec, CpuExecutor::create(*g, cpu));
      HostTensor tokens(TensorType(DType::i32, {1, len})), targets(TensorType(DType::i32, {1, len}));
      std::copy(ids.end() - len, ids.end(), tokens.data<int32_t>());
      std::vector<const HostTensor*> in;
      for (const Value* v : g->inputs()) in.push_back(v->name() == "tokens" ? &tokens : &targets);
      std::vector<const HostTensor*> ps;
      for (const HostTensor& t : params) ps.push_back(&t);
      TPC_ASSIGN(auto out, exec->run(in, ps, 0));
      return out[0];
    }
    // The context at the front of the window, padded with the end-of-document id (never read: causal).
    HostTensor tokens(TensorType(DType::i32, {1, fixedLen})), targets(TensorType(DType::i32, {1, fixedLen}));
    std::fill(tokens.data<int32_t>(), tokens.data<int32_t>() + fixedLen, (*tokenizer)->eod());
    std::fill(targets.data<int32_t>(), targets.data<int32_t>() + fixedLen, 0);
    std::copy(ids.end() - len, ids.end(), tokens.data<int32_t>());
    HostTensor all;
    if (fixedGpu) {
      TensorMap in{{"tokens", tokens}, {"targets", targets}};
      TPC_ASSIGN(TensorMap out, fixedGpu->step(in, ++calls));
      if (!out.count("logits")) return makeError("sample: the GPU forward returned no logits");
      all = out["logits"];
    } else {
      std::vector<const HostTensor*> in;
      for (const Value* v : fixedGraph->inputs()) in.push_back(v->name() == "tokens" ? &tokens : &targets);
      std::vector<const HostTensor*> ps;
      for (const HostTensor& t : params) ps.push_back(&t);
      TPC_ASSIGN(auto out, fixedCpu->run(in, ps, 0));
      all = std::move(out[0]);
    }
    all = all.convertTo(DType::f32);
    HostTensor rows(TensorType(DType::f32, {len, gpt.vocab}));
    std::copy(all.data<float>(), all.data<float>() + len * gpt.vocab, rows.data<float>());
    return rows;
  };

  // The prompt's logits are computed before sampling and written after it succeeds: a command that fails (on
  // overflowing logits, say) leaves no file behind, and an earlier one at that path as it was.
  std::optional<SafetensorsFile> dump;
  int64_t dumpTokens = 0;
  if (flags.has("dump-logits")) {
    int64_t len = std::min<int64_t>(static_cast<int64_t>(ids.size()), window == "fixed" ? fixedLen : gpt.positions);
    auto logits = forward(len);
    if (!logits) return cli::fail("sample", logits.error());
    SafetensorsFile f;
    HostTensor l(TensorType(DType::f32, {len, gpt.vocab}));
    std::copy(logits->data<float>(), logits->data<float>() + l.numel(), l.data<float>());
    HostTensor t(TensorType(DType::i32, {len}));
    std::copy(ids.end() - len, ids.end(), t.data<int32_t>());
    f.tensors = {{"logits", l}, {"tokens", t}};
    dump = std::move(f);
    dumpTokens = len;
  }
  // The text is the command's output: a failed write (a full disk) is an error, not a success with nothing shown.
  auto stdoutFailed = [&]() {
    std::cout.flush();
    return !std::cout ? cli::fail("sample", "cannot write the generated text to stdout (is the disk full?)") : 0;
  };
  auto finish = [&]() -> int {
    if (int failed = stdoutFailed()) return failed;
    if (!dump) return 0;
    if (Status s = writeSafetensors(flags.get("dump-logits"), *dump); !s.ok()) return cli::fail("sample", s.error());
    std::cerr << "wrote the logits of " << dumpTokens << " prompt tokens to " << flags.get("dump-logits") << "\n";
    return 0;
  };

  std::mt19937_64 rng(static_cast<uint64_t>(*seed));
  const SamplingOptions sampling{*temperature, *topK, *topP};
  std::cout << flags.get("prompt") << std::flush;
  unicode::Utf8Stream shown;
  for (int64_t i = 0; i < *maxTokens; ++i) {
    int64_t len = std::min<int64_t>(static_cast<int64_t>(ids.size()), window == "fixed" ? fixedLen : gpt.positions);
    auto logits = forward(len);
    if (!logits) return cli::fail("sample", logits.error());
    const float* last = logits->data<float>() + (len - 1) * gpt.vocab;  // the last real position
    if (const float* bad = std::find_if(last, last + choices, [](float v) { return !std::isfinite(v); });
        bad != last + choices)
      return cli::fail("sample", cat("the logit of token ", bad - last, " is ", *bad, " (at generated token ", i + 1,
                                     "): the model's forward overflowed; its output would be meaningless"));
    const int32_t next = sampleToken(std::span<const float>(last, choices), sampling, rng);
    if (next == (*tokenizer)->eod() && !flags.on("ignore-eod")) {
      std::cout << shown.finish() << "\n";
      if (int failed = stdoutFailed()) return failed;
      std::cerr << "stopped at the end-of-document token after " << i << " generated token" << (i == 1 ? "" : "s")
                << " (--ignore-eod goes on past it)\n";
      return finish();
    }
    ids.push_back(next);
    std::string text;
    if (Status s = (*tokenizer)->decode(std::span<const int32_t>(&next, 1), text); !s.ok())
      return cli::fail("sample", s.error());
    std::cout << shown.push(text);
    if (int failed = stdoutFailed()) return failed;
  }
  std::cout << shown.finish() << "\n";
  return finish();
}

cli::SubcommandRegistration reg("sample", "generate text from a checkpoint, streaming tokens", runSample);

}  // namespace
}  // namespace tpc
