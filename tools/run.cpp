// `tpc run MODEL.fb`: trains a model. Loads the model file, applies Megatron-style flag overrides,
// builds the training step (autodiff), simplifies it, and runs the trainer on the chosen backend.
#include <sys/stat.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <iostream>

#include "frontend/data_dir.h"
#include "frontend/indexed_dataset.h"
#include "frontend/model_file.h"
#include "frontend/token_windows.h"
#include "passes/pipeline.h"
#include "passes/sharding/sharding.h"
#include "runtime/backend_select.h"
#include "runtime/cpu/cpu_backend.h"
#include "runtime/cpu/cpu_mesh_backend.h"
#include "runtime/cpu/test_faults.h"
#include "runtime/param_init.h"
#include "runtime/trainer.h"
#include "tools/cli.h"
#include "tools/compile_pipeline.h"
#include "tools/train_flags.h"

namespace tpc {
namespace {

bool fileExists(const std::string& p) {
  struct stat st{};
  return stat(p.c_str(), &st) == 0;
}

// The dataset prefix as given, or (for the shipped default "data/...") inside tpc's data folder.
Result<std::string> resolveDataPath(const std::string& prefix) {
  if (prefix.empty())
    return makeError("no training data: the model file has no data_path; pass --data-path PREFIX (a dataset made by "
                     "'tpc prepare')");
  if (fileExists(prefix + ".idx")) return prefix;
  if (prefix.rfind("data/", 0) == 0) {
    std::string inData = dataDir() + "/" + prefix.substr(5);
    if (fileExists(inData + ".idx")) return inData;
  }
  return makeError("--data-path ", prefix, ": ", prefix, ".idx not found (run scripts/fetch_data.sh build/bin/tpc for the "
                   "Brown corpus, or make a dataset with 'tpc prepare')");
}

// Training windows from the train split of an indexed dataset.
class DatasetBatches final : public BatchSource {
 public:
  DatasetBatches(IndexedDataset data, DocRange train, uint32_t seq, uint64_t seed)
      : data_(std::move(data)), windows_(data_, train, seq, seed), buf_(seq + 1) {}
  Status status() const { return windows_.status(); }
  uint64_t windowsPerEpoch() const { return windows_.windowsPerEpoch(); }

  Status next(int32_t* tokens, int32_t* targets, int64_t rows, int64_t seq) override {
    for (int64_t r = 0; r < rows; ++r) {
      TPC_TRY(windows_.next(buf_.data()));
      std::copy(buf_.begin(), buf_.begin() + seq, tokens + r * seq);
      std::copy(buf_.begin() + 1, buf_.end(), targets + r * seq);
    }
    return {};
  }

 private:
  IndexedDataset data_;
  TokenWindows windows_;
  std::vector<int32_t> buf_;
};

int runRun(std::vector<std::string> args) {
  cli::Flags flags("run", "tpc run MODEL.fb|MODEL.json [training flags]");
  flags.value("backend", "auto | cpu | cuda", "auto")
      .value("threads", "CPU backend threads (0: all cores)", "0")
      .value("log-jsonl", "also write one JSON object per logged step to this file")
      .value("on-nan", "a step with a NaN/inf loss or gradient norm: stop (fail naming the step and the first "
                       "non-finite value) | skip (drop its update, log it, go on)", "stop")
      .value("collective-timeout", "seconds a collective waits for the other ranks before the run fails (--tp/--dp/--sp)",
             "60")
      .toggle("quiet", "no per-step lines (the summary is still printed)");
  cli::declareTrainingFlags(flags);
  int rc = 0;
  if (!flags.parse(args, rc)) return rc;
  if (flags.positional().size() != 1) return cli::fail("run", "expected one model file (tpc run gpt.fb)");
  const std::string path = flags.positional()[0];

  auto model = loadModelFile(path);
  if (!model) return cli::fail("run", model.error());
  TrainConfig& config = model->config;
  if (Status s = cli::applyTrainingFlags(flags, config); !s.ok()) return cli::fail("run", s.error());
  if (Status s = validateTrainConfig(config); !s.ok()) return cli::fail("run", s.error());
  auto accum = accumulationSteps(config);
  if (!accum) return cli::fail("run", accum.error());
  if (Status s = matchBatchShape(*model, path); !s.ok()) return cli::fail("run", s.error());

  auto onNan = parseOnNonFinite(flags.get("on-nan"));
  if (!onNan) return cli::fail("run", onNan.error());
  auto collectiveTimeout = flags.getDouble("collective-timeout");
  if (!collectiveTimeout) return cli::fail("run", collectiveTimeout.error());
  if (!(*collectiveTimeout >= 0.001 && *collectiveTimeout <= 86400))
    return cli::fail("run", cat("--collective-timeout=", flags.get("collective-timeout"),
                                " is out of range: give seconds in [0.001, 86400]"));

  auto backendKind = selectBackend(flags.get("backend"));
  if (!backendKind) return cli::fail("run", backendKind.error());
  if (*backendKind == BackendKind::Cuda) {
    if (flags.get("backend") == "cuda")
      return cli::fail("run", "--backend=cuda: the CUDA backend lands with issue #6; use --backend=cpu");
    std::cout << "note: a GPU is present, but the CUDA backend lands with issue #6; training on the CPU\n";
  }

  // The training step: forward, backward, clipping, AdamW; then simplified.
  std::unique_ptr<Graph> step = model->forward->clone();
  PassManager pm;
  if (Status s = pm.addPipeline(standardPipeline(*model, *accum)); !s.ok()) return cli::fail("run", s.error());
  if (Status s = pm.run(*step); !s.ok()) return cli::fail("run", cat(path, ": ", s.error()));
  // Sharded (--tp/--dp/--sp): the annotated global step, partitioned into one program per rank.
  std::vector<std::unique_ptr<Graph>> rankGraphs;
  if (!step->mesh().empty()) {
    if (Status s = propagatePlacements(*step); !s.ok()) return cli::fail("run", cat(path, ": ", s.error()));
    for (int64_t r = 0; r < step->mesh().numRanks(); ++r) {
      auto local = partitionForRank(*step, r);
      if (!local) return cli::fail("run", cat(path, ": ", local.error()));
      rankGraphs.push_back(std::move(*local));
    }
  }

  // Data.
  auto dataPath = resolveDataPath(config.dataPath);
  if (!dataPath) return cli::fail("run", dataPath.error());
  auto dataset = IndexedDataset::open(*dataPath);
  if (!dataset) return cli::fail("run", dataset.error());
  if (model->gpt)
    if (Status s = dataset->checkTokenRange(model->gpt->vocab); !s.ok())
      return cli::fail("run", s.error() + " (was the dataset made with the model's tokenizer, '" + config.tokenizer + "'?)");
  auto splits = splitDocuments(config.split, dataset->numDocuments());
  if (!splits) return cli::fail("run", "--split: " + splits.error());
  size_t numDocs = dataset->numDocuments();
  DatasetBatches batches(std::move(dataset).value(), splits->train, static_cast<uint32_t>(config.seqLength), config.seed);
  if (Status s = batches.status(); !s.ok()) return cli::fail("run", s.error());

  // Backend and initial state.
  CpuOptions cpu;
  auto threads = flags.getInt("threads", 0, 1024);
  if (!threads) return cli::fail("run", threads.error());
  cpu.threads = static_cast<int>(*threads);
  cpu.seed = config.seed;
  if (const char* fault = std::getenv("TPC_TEST_FAULT")) {  // tests only (runtime/cpu/test_faults.h)
    auto faults = cpu::parseTestFaults(fault);
    if (!faults) return cli::fail("run", faults.error());
    cpu.faults = *faults;
  }
  CpuMeshOptions mesh;
  mesh.collectiveTimeout = std::chrono::milliseconds(std::llround(*collectiveTimeout * 1000));
  std::unique_ptr<Backend> backend =
      rankGraphs.empty() ? createCpuBackend(cpu) : createCpuMeshBackend(std::move(rankGraphs), cpu, mesh);
  if (Status s = checkStateFitsInMemory(*step, cpu.fp64 ? 8 : 4, physicalMemoryBytes(), path); !s.ok())
    return cli::fail("run", s.error());
  TensorMap state;
  int64_t numParams = 0;
  for (const Value* p : model->forward->params()) numParams += p->type().numel();
  for (const Value* p : step->params()) state[p->name()] = initParam(*p, config.seed);
  if (Status s = backend->prepare(*step, state); !s.ok()) return cli::fail("run", s.error());

  std::cout << "tpc run " << path << ": " << numParams << " parameters, training step of " << step->numNodes()
            << " ops on backend " << backend->name() << (step->mesh().empty() ? "" : " over " + step->mesh().str())
            << "\n"
            << "  batch: micro " << config.microBatch << " x accumulation " << *accum << " x dp " << config.dp << " = global "
            << config.globalBatch << " sequences of " << config.seqLength << " tokens\n"
            << "  data: " << *dataPath << " (" << numDocs << " documents, " << splits->train.size() << " for training, "
            << batches.windowsPerEpoch() << " windows per epoch)\n"
            << "  lr " << config.lr << " -> " << config.minLr << " (" << config.decayStyle << ", warmup "
            << config.warmupIters << "), " << config.trainIters << " steps" << std::endl;

  TrainerSettings settings;
  settings.trainIters = config.trainIters;
  settings.logInterval = flags.on("quiet") ? 0 : config.logInterval;
  settings.lr.maxLr = config.lr;
  settings.lr.minLr = config.minLr;
  settings.lr.warmupIters = config.warmupIters;
  settings.lr.decayIters = config.decayIters > 0 ? config.decayIters : config.trainIters;
  settings.lr.style = config.decayStyle;
  settings.logJsonl = flags.get("log-jsonl");
  settings.onNonFinite = *onNan;
  auto report = train(*backend, *step, batches, settings, std::cout);
  if (!report) return cli::fail("run", report.error());
  const auto& losses = report->losses;
  std::printf("done: %zu steps in %s, %.0f tokens/s; loss %.4f -> %.4f (%.1f%% lower)", losses.size(),
              formatDuration(report->seconds).c_str(), report->tokensPerSecond, losses.front(), losses.back(),
              100.0 * (1.0 - losses.back() / losses.front()));
  if (!report->skippedSteps.empty()) std::printf("; %zu non-finite steps skipped", report->skippedSteps.size());
  std::printf("\n");
  return 0;
}

cli::SubcommandRegistration reg("run", "train a model file (CPU reference backend; flags as in Megatron-LM)", runRun);

}  // namespace
}  // namespace tpc
