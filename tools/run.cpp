// `tpc run MODEL.fb`: trains a model. Loads the model file, applies Megatron-style flag overrides,
// builds the training step (autodiff), simplifies it, and runs the trainer on the chosen backend.
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iomanip>
#include <iostream>
#include <iterator>
#include <map>
#include <optional>
#include <sstream>
#include <thread>
#include <tuple>

#include "frontend/data_blend.h"
#include "frontend/data_dir.h"
#include "frontend/indexed_dataset.h"
#include "frontend/model_file.h"
#include "frontend/token_windows.h"
#include "frontend/tokenizer.h"
#include "ir/file_io.h"
#include "ir/json_text.h"
#include "models/gpt.h"
#include "passes/builtin_passes.h"
#include "passes/pipeline.h"
#include "passes/sharding/sharding.h"
#include "runtime/backend_select.h"
#include "runtime/checkpoint.h"
#include "runtime/evaluator.h"
#include "runtime/gpu_peaks.h"
#include "runtime/memory_estimate.h"
#include "runtime/metrics_server.h"
#include "runtime/tensorboard_writer.h"
#include "runtime/cpu/cpu_backend.h"
#include "runtime/cpu/cpu_mesh_backend.h"
#include "runtime/cpu/mpi_communicator.h"
#include "runtime/cpu/test_faults.h"
#ifdef TPC_HAVE_CUDA
#include "runtime/cuda/cuda_backend.h"
#endif
#include "runtime/mpi_world.h"
#include "runtime/param_init.h"
#include "runtime/trainer.h"
#include "tools/cli.h"
#include "tools/compile_pipeline.h"
#include "tools/early_exit.h"
#include "tools/output_paths.h"
#include "tools/pipeline_flags.h"
#include "tools/resume_settings.h"
#include "tools/train_flags.h"

namespace tpc {
namespace {

bool fileExists(const std::string& p) {
  struct stat st{};
  return stat(p.c_str(), &st) == 0;
}

namespace fs = std::filesystem;

// Whether checkpoints can be written into `dir`: its folders are made and a file is written there, then whatever
// this made is removed again (the first save makes them for good), so a run that fails before it leaves nothing.
Status checkCheckpointFolder(const std::string& dir) {
  std::error_code ec;
  RemoveOnError cleanup(firstMissingFolder(dir));  // never kept: the first save makes them for good
  fs::create_directories(dir, ec);
  const fs::path probe = fs::path(dir) / cat(".tpc-write-test.", getpid());
  std::error_code removed;
  const bool ok = !ec && std::ofstream(probe) && fs::remove(probe, removed);
  if (!ok)
    return makeError("--save ", dir, ": error: cannot write checkpoints into this folder",
                     ec ? cat(" (", ec.message(), ")") : std::string(), "; pick a writable folder");
  return {};
}

// A fresh run does not write into another run's checkpoints: its iter_N folders and the latest-iteration file would
// replace theirs, and --keep would delete them. Resuming from that folder (--load DIR --save DIR) is the one way in.
// A fine-tune is a new run (step 1, fresh AdamW state): it never saves into the folder of the checkpoint it starts
// from, where its iter_N would replace that checkpoint's and --keep would delete it.
Status checkSaveFolderIsFree(const std::string& dir, const std::optional<LoadedCheckpoint>& loaded, bool finetune) {
  if (loaded && cli::insideFolder(loaded->path, dir)) {  // loaded->path is DIR/iter_N
    if (!finetune) return {};
    return makeError("--save ", dir, ": error: holds the checkpoint --finetune starts from (", loaded->path,
                     "); a fine-tune is a new run: save it to another folder");
  }
  const std::string held = checkpointHeldIn(dir);
  if (held.empty()) return {};
  return makeError("--save ", dir, ": error: already holds another run's checkpoints (", held, "); resume that run with "
                   "--load ", dir, ", or pick an empty or new folder");
}

// The dataset prefix as given, or (for the shipped default "data/...") inside tpc's data folder.
// `dataName`: where the prefix came from, for errors ("--data-path", or "m.json: config.data_path").
Result<std::string> resolveDataPath(const std::string& prefix, const std::string& dataName = "--data-path") {
  if (prefix.empty())
    return makeError("no training data: the model file has no data_path; pass --data-path PREFIX (a dataset made by "
                     "'tpc prepare')");
  if (fileExists(prefix + ".idx")) return prefix;
  if (prefix.rfind("data/", 0) == 0) {
    std::string inData = dataDir() + "/" + prefix.substr(5);
    if (fileExists(inData + ".idx")) return inData;
  }
  for (const char* ext : {".bin", ".idx"})
    if (prefix.size() > 4 && prefix.compare(prefix.size() - 4, 4, ext) == 0 && fileExists(prefix.substr(0, prefix.size() - 4) + ".idx"))
      return makeError(dataName, " ", prefix, ": give the dataset's prefix, without ", ext, ": ", prefix.substr(0, prefix.size() - 4));
  return makeError(dataName, " ", prefix, ": ", prefix, ".idx not found",
                   dataName.rfind("--", 0) == 0 || prefix.rfind('/', 0) == 0 ? "" : " (relative to the current folder)",
                   " (run scripts/fetch_data.sh build/bin/tpc for the Brown corpus, or make a dataset with 'tpc prepare')");
}

// Training windows from one split of the datasets of --data-path (one dataset, or a Megatron-style blend). With
// dumpTo(), every window read is also appended to a file (tpc run --dump-batches): seq + 1 int32 tokens per row,
// little-endian, in the order the trainer reads them, so that another trainer can be fed exactly tpc's batches.
class DatasetBatches final : public BatchSource {
 public:
  DatasetBatches(std::vector<BlendedWindows::Part> parts, uint32_t seq, uint64_t seed)
      : windows_(std::move(parts), seq, seed), buf_(seq + 1) {}
  // The file is made at the first window read, so that a run failing before its first step leaves none. A resumed
  // run (reading from a position past 0) keeps the rows before that position of a file that holds them (the file of
  // the run it resumes, as a resumed --log-jsonl keeps its lines) and appends after them; any other file is written
  // anew, from the resumed step's rows.
  void dumpTo(const std::string& path) { dumpPath_ = path; }
  // At the run's end: the rows read past `trained` (the windows of the steps trained; a step read ahead of an early
  // stop was not) are cut off, so that the file holds exactly the trained steps' rows.
  Status finishDump(uint64_t trained) {
    if (!dump_.is_open()) return {};
    dump_.close();
    std::error_code ec;
    std::filesystem::resize_file(dumpPath_, (trained - std::min(trained, dumpStart_)) * buf_.size() * sizeof(int32_t), ec);
    if (ec) return makeError("--dump-batches ", dumpPath_, ": cannot cut off the rows read ahead of the stop: ", ec.message());
    return {};
  }
  Status status() const { return windows_.status(); }
  const BlendedWindows& windows() const { return windows_; }
  uint64_t position() const { return windows_.position(); }
  Status seek(uint64_t position, const std::vector<uint64_t>& taken) { return windows_.seek(position, taken); }
  std::vector<uint64_t> takenAt(uint64_t position) const { return windows_.takenAt(position); }
  void keepRecent(size_t samples) { windows_.keepRecent(samples); }

  Status next(int32_t* tokens, int32_t* targets, int64_t rows, int64_t seq) override {
    if (!dumpPath_.empty() && !dump_.is_open()) {
      const uint64_t rowBytes = buf_.size() * sizeof(int32_t), at = windows_.position();
      std::error_code ec;
      const uint64_t size = at > 0 ? std::filesystem::file_size(dumpPath_, ec) : 0;
      bool append = at > 0 && !ec && size >= at * rowBytes && size % rowBytes == 0;
      if (append) std::filesystem::resize_file(dumpPath_, at * rowBytes, ec), append = !ec;
      dumpStart_ = append ? 0 : at;
      dump_.open(dumpPath_, std::ios::binary | (append ? std::ios::app : std::ios::trunc));
      if (!dump_) return makeError("--dump-batches ", dumpPath_, ": cannot write the file (does its folder exist and is it writable?)");
    }
    for (int64_t r = 0; r < rows; ++r) {
      TPC_TRY(windows_.next(buf_.data()));
      if (dump_.is_open() && !dump_.write(reinterpret_cast<const char*>(buf_.data()),
                                          static_cast<std::streamsize>(buf_.size() * sizeof(int32_t))).flush()) {
        dump_.close();
        std::remove(dumpPath_.c_str());  // no truncated dump left behind
        return makeError("--dump-batches ", dumpPath_, ": writing the batches failed (is the disk full?)");
      }
      std::copy(buf_.begin(), buf_.begin() + seq, tokens + r * seq);
      std::copy(buf_.begin() + 1, buf_.end(), targets + r * seq);
    }
    return {};
  }

 private:
  BlendedWindows windows_;
  std::vector<int32_t> buf_;
  std::string dumpPath_;
  std::ofstream dump_;
  uint64_t dumpStart_ = 0;  // the window position of the file's first row
};

// The datasets of --data-path: one, or a Megatron-style blend, each resolved, opened, checked against the model's
// vocabulary and split by --split on its own (as Megatron-LM splits each dataset of a blend).
struct TrainingData {
  std::vector<DataBlendEntry> entries;  // prefixes resolved
  std::vector<DocSplits> splits;

  // Dataset i's documents: its splits end at the last one (splitDocuments).
  uint64_t numDocs(size_t i) const { return splits[i].test.end; }

  uint64_t documents(DocRange DocSplits::*split) const {
    uint64_t n = 0;
    for (const DocSplits& s : splits) n += (s.*split).size();
    return n;
  }
  // The parts of one split, each dataset opened again (a memory map of its own). A dataset with no documents in a
  // split is left out of that split's blend.
  Result<std::vector<BlendedWindows::Part>> parts(DocRange DocSplits::*split) const {
    std::vector<BlendedWindows::Part> out;
    for (size_t i = 0; i < entries.size(); ++i) {
      if ((splits[i].*split).size() == 0) continue;
      TPC_ASSIGN(IndexedDataset data, IndexedDataset::open(entries[i].prefix));
      out.push_back({std::move(data), splits[i].*split, entries[i].weight});
    }
    return out;
  }
};

// "  data: PREFIX (N documents, M for training, W windows per epoch)", or for a blend a line per dataset with the
// share of the training windows it gives.
std::string describeData(const TrainingData& data, const BlendedWindows& train) {
  std::ostringstream out;
  auto counts = [&](size_t i) {
    return cat(data.numDocs(i), " documents, ", data.splits[i].train.size(), " for training, ",
               train.windows(i).windowsPerEpoch(), " windows per epoch");
  };
  if (data.entries.size() == 1) {
    out << "  data: " << data.entries[0].prefix << " (" << counts(0) << ")\n";
    return out.str();
  }
  const bool weighted = data.entries[0].weight > 0;
  out << "  data: a blend of " << data.entries.size() << " datasets, " << (weighted ? "by the weights given" : "by size")
      << " (share of the training windows):\n";
  for (size_t i = 0; i < data.entries.size(); ++i)
    out << "    " << std::fixed << std::setprecision(1) << 100 * train.share(i) << std::defaultfloat
        << std::setprecision(6) << "% " << data.entries[i].prefix << " (" << counts(i) << ")\n";
  return out.str();
}

Result<TrainingData> openTrainingData(const TrainConfig& config, const std::string& splitName, const std::string& dataName,
                                      const std::optional<GptConfig>& gpt) {
  TrainingData d;
  TPC_ASSIGN(d.entries,
             parseDataBlend(config.dataPath, [](const std::string& p) { return resolveDataPath(p).ok(); }, dataName));
  for (DataBlendEntry& e : d.entries) {
    TPC_ASSIGN(e.prefix, resolveDataPath(e.prefix, dataName));
    TPC_ASSIGN(IndexedDataset dataset, IndexedDataset::open(e.prefix));
    if (gpt)
      if (Status s = dataset.checkTokenRange(gpt->vocab); !s.ok()) {
        // A tokenizer with more ids than the model has rows: no dataset of it fits; the model file is what to fix.
        const int64_t tokenizerIds = tokenizerIdCount(config.tokenizer);
        if (gpt->vocab < tokenizerIds)
          return makeError(s.error(), ": the model's tokenizer '", config.tokenizer, "' has ", tokenizerIds,
                           " ids, more than its vocabulary of ", gpt->vocab, " (arch.vocab): write the model file again "
                           "with `tpc new` (--vocab ", tokenizerIds, ", or a preset of the ", config.tokenizer,
                           " tokenizer), or set its config.tokenizer_type to the tokenizer the vocabulary is for");
        return makeError(s.error(), ": the model's tokenizer is '", config.tokenizer, "' (vocabulary ", gpt->vocab,
                         "); make the dataset with it (tpc prepare --tokenizer ", config.tokenizer,
                         ") or give --data-path of one that was");
      }
    auto split = splitDocuments(config.split, dataset.numDocuments());
    if (!split) return makeError(splitName, ": ", split.error());
    d.splits.push_back(*split);
  }
  return d;
}

// Under mpirun (one process per mesh rank): this process's place in the job; null otherwise.
// `training` is set once the processes meet: the CUDA backend's before partitioning their own ranks (they exchange
// NCCL ids at prepare), the CPU backend's at the first step. From then on a failing process ends the job.
struct MpiJob {
  mpi::World world;
  bool training = false;
  // Rank > 0: its stderr, captured in `captured` (rank 0 reports the errors all processes share); the original
  // is stderrFd.
  int stderrFd = -1;
  std::FILE* captured = nullptr;
  // Every process contributes `bytes`, `out` gets them in rank order (the backends' allGatherWorld).
  std::function<Status(const void* in, int64_t bytes, void* out)> allGather() const {
    mpi::Comm c = world.comm;
    return [c](const void* in, int64_t bytes, void* out) { return mpi::allGather(c, in, bytes, out); };
  }
};

// Ends an mpirun job from a process that failed once the processes met (the others may be waiting for it in a
// collective). Rank 0 says why and ends the job at once. Another rank waits a moment first: where rank 0 fails
// the same way (a non-finite step, a mesh-wide error), rank 0's one message ends the job meanwhile; where its
// failure is its own, it then shows what it captured and ends the job itself.
[[noreturn]] void endJob(MpiJob& job, int rc) {
  std::fflush(stdout);
  std::fflush(stderr);
  if (job.world.rank != 0 && job.captured && job.stderrFd >= 0) {
    std::this_thread::sleep_for(std::chrono::seconds(2));
    std::rewind(job.captured);
    char buf[4096];
    for (size_t n; (n = std::fread(buf, 1, sizeof buf, job.captured)) > 0;)
      if (write(job.stderrFd, buf, n) < 0) break;
  }
  mpi::abortAll(rc);
}

#ifdef TPC_HAVE_CUDA
// The GPU of this process of an mpirun job: that of its local rank, or the one GPU a launcher left visible to it
// (CUDA_VISIBLE_DEVICES naming a single device, as Slurm's per-task binding does).
int processDevice() {
  const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
  if (visible && *visible && !std::strchr(visible, ',')) return 0;
  return static_cast<int>(mpi::launcherLocalRank());
}
#endif

int runRunIn(std::vector<std::string> args, MpiJob* job) {
  const auto runStart = std::chrono::steady_clock::now();
  auto secondsSince = [](std::chrono::steady_clock::time_point t) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
  };
  cli::Flags flags("run", "tpc run MODEL.fb|MODEL.json [training flags]\n"
                          "       mpirun -np N tpc run MODEL.fb --tp/--dp/--sp ... (a process per mesh rank, N = tp x dp x "
                          "sp; with --backend cuda each drives the GPU of its local rank, NCCL between them)");
  flags.value("save", "checkpoint directory to write (as Megatron-LM's --save)")
      .value("save-interval", "steps between checkpoints; 0: only after the last step (default: the model file's "
                              "save_interval)")
      .value("keep", "keep K checkpoints in --save: the one just written and the newest before it; 0: all", "0")
      .value("load", "resume from this checkpoint directory, under any --tp/--dp/--sp")
      .value("metrics-port", "serve the run's figures for Prometheus at http://127.0.0.1:PORT/metrics")
      .value("tensorboard-dir", "also write the run's figures as TensorBoard event files in this folder (made if missing), under Megatron-LM's tags (lm loss, learning-rate, grad-norm, lm loss validation, ...)")
      .value("eval-interval", "steps between evaluations on the validation split, and one after the last step; 0: none "
                              "(default: the model file's eval_interval)")
      .value("eval-iters", "batches per evaluation (validation, and test after the last step), each a global batch as "
                           "in Megatron-LM; 0: none (default: the model file's eval_iters)")
      .toggle("use-checkpoint-opt_param-scheduler", "with --load: keep the checkpoint's lr schedule (--lr, --min-lr, "
                                                    "warmup, decay steps and style), whatever the flags say")
      .toggle("override-opt_param-scheduler", "with --load: the flags' lr schedule, where it differs from the "
                                              "checkpoint's, without a warning (a note names each change)")
      .toggle("finetune", "with --load: take the parameters only (AdamW state, step and data order start anew; a new run, so --save goes to another folder)")
      .toggle("save-initial", "with --save: also write the initial state, before step 1, as iteration 0 (a comparison "
                              "aid: another trainer can start from tpc's initial weights)")
      .value("dump-batches", "write every training window read (seq-length + 1 int32 tokens per row, the rows of "
                             "step 1, then step 2, ...) to this file: a comparison aid to feed another trainer "
                             "tpc's batches (a resumed run appends to the file of the run it resumes)");
  flags.value("backend", "auto | cpu | cuda", "auto")
      .value("collectives", "CUDA with --tp/--dp: nccl (a GPU per rank) | virtual (all ranks on one GPU) | auto", "auto")
      .value("distributed-backend", "as Megatron-LM, but only nccl (what tpc's GPU ranks use; CPU ranks use MPI)")
      .value("threads", "CPU backend threads (0: all cores)", "0")
      .value("log-jsonl", "also write one JSON object per logged step to this file")
      .value("on-nan", "a step with a NaN/inf loss or gradient norm: stop (fail naming the step and the first "
                       "non-finite value) | skip (drop its update, log it, go on)", "stop")
      .value("collective-timeout", "seconds a collective waits for the other ranks before the run fails (--tp/--dp/--sp)",
             "60")
      .value("profile-step", "CUDA: time step N launch by launch (CUDA events) and print its GPU time per op; 0: off",
             "0")
      .value("profile-csv", "with --profile-step: also write every launch of that step (op, ms, TFLOP/s, kernel) to "
                            "this CSV file")
      .toggle("no-fuse", "CUDA backend: one kernel per elementwise op (leave out the fuse pass that ends the pipeline)")
      .toggle("no-fuse-classifier", "CUDA backend: the loss and its gradient as two kernels, dlogits in a buffer of its "
                                    "own (leave out the fuse-classifier pass before fuse)")
      .toggle("one-stream", "CUDA with --tp/--dp: the collectives on the compute stream too (no overlap; by default "
                            "they run on a communication stream of their own)")
      .value("initial-loss-scale", "--precision fp16: the loss scale to start from", "65536")
      .value("loss-scale-window", "--precision fp16: finite steps in a row after which the loss scale doubles", "1000")
      .value("min-loss-scale", "--precision fp16: the run fails when an overflow would halve the scale below this", "1")
      .value("hysteresis", "--precision fp16: overflows (since the scale last doubled) before it is halved, as in "
                           "Megatron-LM; 1: at every overflow", "2")
      .toggle("quiet", "no per-step lines on the console (the summary is still printed; --log-jsonl keeps every logged step, the metrics every step)");
  cli::declareTrainingFlags(flags);
  cli::declarePipelineFlags(flags);
  cli::EarlyExit::declareFlags(flags);
  int rc = 0;
  if (!flags.parse(args, rc)) return rc;
  if (auto blend = parseDataBlend(flags.get("data-path")); flags.positional().empty() && blend)
    for (const DataBlendEntry& e : *blend)
      if (looksLikeModelFile(e.prefix))
        return cli::fail("run", cat("expected one model file, and '", e.prefix, "' was read as a dataset prefix of "
                                    "--data-path (the words after it up to the next option are all prefixes); put the "
                                    "model file first: tpc run ", e.prefix, " --data-path ..."));
  if (flags.positional().size() != 1) return cli::fail("run", "expected one model file (tpc run gpt.fb)");
  const std::string path = flags.positional()[0];

  auto model = loadModelFile(path);
  if (!model) return cli::fail("run", model.error());
  TrainConfig& config = model->config;
  if (Status s = cli::applyTrainingFlags(flags, config); !s.ok()) return cli::fail("run", s.error());
  const GptConfig* gpt = model->gpt ? &*model->gpt : nullptr;
  if (Status s = cli::validateTrainingFlags(flags, config, gpt); !s.ok()) return cli::fail("run", s.error());
  auto tpPolicy = cli::applyPipelineFlags(flags, config, PassRegistry::global(), gpt);
  if (!tpPolicy) return cli::fail("run", tpPolicy.error());
  auto accum = accumulationSteps(config);
  if (!accum) return cli::fail("run", accum.error());
  if (Status s = matchBatchShape(*model, path); !s.ok()) return cli::fail("run", s.error());
  // --save-interval, --eval-interval and --eval-iters default to the model file's save_interval, eval_interval
  // and eval_iters (as its log_interval is --log-interval's default).
  auto flagOrFile = [&](const char* flag, int64_t fileValue, long long lo) -> Result<int64_t> {
    if (!flags.has(flag)) return fileValue;
    TPC_ASSIGN(long long v, flags.getInt(flag, lo, int64_t(1) << 40));
    return v;
  };
  auto saveInterval = flagOrFile("save-interval", config.saveInterval, 0);
  if (!saveInterval) return cli::fail("run", saveInterval.error());
  auto earlyExit = cli::EarlyExit::fromFlags(flags);
  if (!earlyExit) return cli::fail("run", earlyExit.error());
  auto keep = flags.getInt("keep", 0, int64_t(1) << 40);
  if (!keep) return cli::fail("run", keep.error());
  auto evalInterval = flagOrFile("eval-interval", config.evalInterval, 0);
  if (!evalInterval) return cli::fail("run", evalInterval.error());
  auto evalIters = flagOrFile("eval-iters", config.evalIters, 0);
  if (!evalIters) return cli::fail("run", evalIters.error());
  // As Megatron-LM's eval_iters, each a global batch: the micro-batches of `accum` steps, the same loss whatever the
  // micro batch size.
  const int64_t evalMicroBatches = *evalIters * *accum;
  if (*evalInterval > 0 && *evalIters == 0) {
    if (flags.has("eval-iters")) {  // Megatron-LM's --eval-iters 0: no evaluation
      if (!job || job->world.rank == 0) std::cout << "no evaluation: --eval-iters 0" << std::endl;
    } else if (flags.has("eval-interval"))
      return cli::fail("run", cat(path, ": error: config.eval_iters=0 leaves the evaluations of --eval-interval ", *evalInterval,
                                  " no batches; give --eval-iters N"));
    // As in Megatron-LM, eval_iters 0 means no evaluation.
    else if (!job || job->world.rank == 0)
      std::cout << "no evaluation: the model file's eval_iters is 0 (its eval_interval " << *evalInterval
                << " is not applied)" << std::endl;
    *evalInterval = 0;
  }
  auto profileStep = flags.getInt("profile-step", 0, int64_t(1) << 40);
  if (!profileStep) return cli::fail("run", profileStep.error());
  for (const char* folder : {"save", "load"})
    if (flags.has(folder) && flags.get(folder).empty())
      return cli::fail("run", cat("--", folder, " is empty; name the checkpoint folder"));
  if (flags.on("save-initial") && !flags.has("save"))
    return cli::fail("run", "--save-initial writes iteration 0 into the --save folder; add --save DIR");
  if (flags.on("save-initial") && flags.has("load"))
    return cli::fail("run", "--save-initial writes the initial state of a fresh run; drop it when resuming with --load");
  if (flags.on("finetune") && !flags.has("load"))
    return cli::fail("run", "--finetune takes the parameters of the checkpoint that --load names; add --load DIR");
  // As in Megatron-LM, the two exclude each other; without a checkpoint to resume, neither does anything.
  if (flags.on("use-checkpoint-opt_param-scheduler") && flags.on("override-opt_param-scheduler"))
    return cli::fail("run", "--use-checkpoint-opt_param-scheduler and --override-opt_param-scheduler exclude each other "
                            "(the checkpoint's lr schedule, or the flags'); give one");
  if (flags.on("use-checkpoint-opt_param-scheduler") && flags.on("finetune"))
    return cli::fail("run", "--use-checkpoint-opt_param-scheduler resumes the checkpoint's lr schedule, --finetune starts "
                            "a new run from its parameters; give one");
  if (!job || job->world.rank == 0) cli::warnIneffectiveFlags("run", flags, config);
  // The model file's save_interval applies when the run saves; the flags are refused without --save.
  const bool intervalGiven = flags.has("save-interval") && *saveInterval > 0;
  if (!flags.has("save") && (intervalGiven || *keep > 0))
    return cli::fail("run", cat(intervalGiven ? "--save-interval" : "--keep", " applies to the checkpoints of --save; add --save DIR"));
  std::optional<LoadedCheckpoint> checkpoint;
  if (flags.has("load")) {
    auto c = loadCheckpoint(flags.get("load"));
    if (!c) return cli::fail("run", c.error());
    checkpoint = std::move(*c);
    if (flags.on("finetune")) {
      checkpoint->state = CheckpointState{};  // the parameters only: step 0, fresh data order, this run's seed
    } else {
      // The data order and dropout masks follow the seed: a resumed run keeps the one it was trained with.
      if (flags.has("seed") && config.seed != checkpoint->state.seed)
        return cli::fail("run", cat("--seed ", config.seed, " differs from the checkpoint's seed ", checkpoint->state.seed,
                                    " (", checkpoint->path, "); drop --seed to resume the same data order"));
      config.seed = checkpoint->state.seed;
      if (flags.on("use-checkpoint-opt_param-scheduler"))
        if (Status st = cli::useCheckpointSchedule(checkpoint->state.settings, checkpoint->path + "/state.json", config);
            !st.ok())
          return cli::fail("run", st.error());
    }
    if (checkpoint->state.iteration >= config.trainIters) {
      std::cout << checkpoint->path << " is at iteration " << checkpoint->state.iteration << ", --train-iters is "
                << config.trainIters << ": nothing to train\n";
      return 0;
    }
  }

  // Megatron-LM's scripts pass --distributed-backend nccl: tpc's GPU ranks talk over NCCL anyway.
  if (const std::string b = flags.get("distributed-backend"); flags.has("distributed-backend") && b != "nccl")
    return cli::fail("run", b == "gloo" ? "--distributed-backend gloo: tpc has no gloo; its CPU ranks talk over MPI (mpirun "
                                          "-np N tpc run MODEL.fb --backend cpu ...), its GPU ranks over NCCL; drop the flag "
                                          "(and give --backend cpu for ranks on the CPU)"
                                        : cat("--distributed-backend ", b, ": expected nccl, what tpc's GPU ranks use (its "
                                              "CPU ranks use MPI); drop the flag"));
  if (const std::string c = flags.get("collectives"); c != "auto" && c != "nccl" && c != "virtual")
    return cli::fail("run", "--collectives=" + c + " is not a collectives mode (expected auto, nccl or virtual)");
  auto onNan = parseOnNonFinite(flags.get("on-nan"));
  if (!onNan) return cli::fail("run", onNan.error());
  auto collectiveTimeout = flags.getDouble("collective-timeout");
  if (!collectiveTimeout) return cli::fail("run", collectiveTimeout.error());
  if (!(*collectiveTimeout >= 0.001 && *collectiveTimeout <= 86400))
    return cli::fail("run", cat("--collective-timeout=", flags.get("collective-timeout"),
                                " is out of range: give seconds in [0.001, 86400]"));

  auto backendKind = selectBackend(flags.get("backend"));
  if (!backendKind) return cli::fail("run", backendKind.error());
  if (*backendKind != BackendKind::Cuda && flags.get("collectives") != "auto")
    return cli::fail("run", cat("--collectives ", flags.get("collectives"), " chooses how CUDA ranks talk; this run is on the ",
                                "CPU backend (drop the flag, or give --backend cuda on a machine with a GPU)"));
  if (*profileStep > config.trainIters)
    return cli::fail("run", cat("--profile-step ", *profileStep, " is after the run's last step (--train-iters ",
                                config.trainIters, "): pick a step from 1 to ", config.trainIters));
  if (flags.has("profile-csv") && !flags.get("profile-csv").empty() && (!job || job->world.rank == 0))  // rank 0 writes it
    if (Status s = cli::checkOutputFile("--profile-csv", flags.get("profile-csv")); !s.ok()) return cli::fail("run", s.error());
  if (*profileStep > 0 && *backendKind != BackendKind::Cuda)
    return cli::fail("run", "--profile-step times CUDA kernels: it needs the CUDA backend (--backend cuda on a machine with a GPU)");
  if (flags.has("profile-csv") && *profileStep == 0)
    return cli::fail("run", "--profile-csv writes the launches of the step --profile-step times; add --profile-step N");
  if (flags.has("profile-csv") && flags.get("profile-csv").empty())
    return cli::fail("run", "--profile-csv needs a file name");
  // --precision auto: bf16 compute on the GPU (the default there), fp32 on the CPU.
  if (config.precision == "auto") config.precision = *backendKind == BackendKind::Cuda ? "bf16" : "fp32";
  const std::string precision = config.precision;

  // fp16: dynamic loss scaling (the scale is an input of the step; trainer.h says what a skipped step does).
  std::optional<LossScaleSettings> lossScaling;
  if (precision == "fp16") {
    LossScaleSettings ls;
    auto initial = flags.getDouble("initial-loss-scale");
    if (!initial) return cli::fail("run", initial.error());
    auto minimum = flags.getDouble("min-loss-scale");
    if (!minimum) return cli::fail("run", minimum.error());
    auto window = flags.getInt("loss-scale-window", 1, int64_t(1) << 40);
    if (!window) return cli::fail("run", window.error());
    auto hysteresis = flags.getInt("hysteresis", 1, int64_t(1) << 40);
    if (!hysteresis) return cli::fail("run", hysteresis.error());
    ls.initial = *initial;
    ls.min = *minimum;
    ls.window = *window;
    ls.hysteresis = *hysteresis;
    if (Status s = ls.validate(); !s.ok()) return cli::fail("run", s.error());
    lossScaling = ls;
  } else {
    for (const char* f : {"initial-loss-scale", "loss-scale-window", "min-loss-scale", "hysteresis"})
      if (flags.has(f))
        return cli::fail("run", cat("--", f, " applies to --precision fp16 only (this run is ", precision,
                                    "); drop it or add --precision fp16"));
  }

  // The training step: forward, backward, clipping, AdamW; then simplified.
  std::unique_ptr<Graph> step = model->forward->clone();
  PassManager pm;
  std::string pipeline = standardPipeline(*model, *accum, std::nullopt, *tpPolicy);
  // tpc run builds this pipeline itself (no source): its errors name the pass (and its plugin), not a place in
  // a text the user never gave.
  if (Status s = pm.addPipeline(pipeline, ""); !s.ok()) return cli::fail("run", s.error());
  if (Status s = pm.run(*step); !s.ok()) return cli::fail("run", cat(path, ": ", s.error()));
  if (config.tp > 1 && step->mesh().axisSize("tp") != config.tp)
    return cli::fail("run", cat("--sharding-policy=", *tpPolicy, " did not put mesh axis tp=", config.tp,
                                " on the graph (", step->mesh().empty() ? "no mesh" : step->mesh().str(),
                                "); a sharding policy must call ensureMeshAxis(g, \"tp\", tp, ...)"));
  if (job && step->mesh().empty() && job->world.size > 1)
    return cli::fail("run", cat("mpirun started ", job->world.size, " processes for an unsharded run; add --tp, --dp or "
                                "--sp so that their product is ", job->world.size));
  if (job && !step->mesh().empty() && step->mesh().numRanks() != job->world.size)
    return cli::fail("run", cat("mpirun started ", job->world.size, " processes, but the run's ", step->mesh().str(), " has ",
                                step->mesh().numRanks(), " ranks: start one process per rank (mpirun -np ",
                                step->mesh().numRanks(), "), or set --tp/--dp/--sp so that their product is ",
                                job->world.size));
  // One process per rank on the GPU: this process partitions and compiles its own rank alone.
  const bool cudaProcess = job && !step->mesh().empty() && *backendKind == BackendKind::Cuda;
  // Under mpirun the processes meet from here on: a process that fails ends the job (mpi::abortAll) and says
  // why itself. The CUDA backend's processes meet early: from partitioning its own rank on, one can fail alone
  // while the others wait for it (in the NCCL id exchange).
  if (cudaProcess) job->training = true;
  // The one mesh rank a CUDA process partitions and runs (the step's and evaluation's); nullopt: every rank.
  const std::optional<int64_t> ownRank = cudaProcess ? std::optional<int64_t>(job->world.rank) : std::nullopt;
  // Sharded (--tp/--dp/--sp): the annotated global step, partitioned into one program per rank.
  std::vector<std::unique_ptr<Graph>> rankGraphs;
  if (!step->mesh().empty()) {
    // One process running every rank on the CPU: what cannot fit is refused from rank 0's program before the others
    // are partitioned (at --dp 65536 that alone took minutes and 12 GB before any message).
    if (!job && *backendKind == BackendKind::Cpu && step->mesh().numRanks() > 1) {
      if (Status s = propagatePlacements(*step); !s.ok()) return cli::fail("run", cat(path, ": ", s.error()));
      auto first = partitionForRank(*step, 0);
      if (!first) return cli::fail("run", cat(path, ": ", first.error()));
      const MemoryEstimate one = estimateMemory(**first, 4);
      MemoryEstimate all;
      for (int64_t r = 0; r < step->mesh().numRanks(); ++r) all += one;
      if (Status s = checkHostMemory(all, hostMemoryLimit(0), cat("--tp ", config.tp, " --dp ", config.dp), step->mesh().numRanks()); !s.ok())
        return cli::fail("run", s.error());
      rankGraphs.push_back(std::move(*first));
      for (int64_t r = 1; r < step->mesh().numRanks(); ++r) {
        auto rank = partitionForRank(*step, r);
        if (!rank) return cli::fail("run", cat(path, ": ", rank.error()));
        rankGraphs.push_back(std::move(*rank));
      }
    } else {
      auto ranks = partitionRanks(*step, ownRank);
      if (!ranks) return cli::fail("run", cat(path, ": ", ranks.error()));
      rankGraphs = std::move(*ranks);
    }
  }
  // The fused classifier and the fusion groups for the CUDA backend, on the program each rank runs (after
  // partition).
  std::string cudaPasses = std::string(flags.on("no-fuse-classifier") ? "" : ",fuse-classifier") +
                           (flags.on("no-fuse") ? "" : ",fuse");
  if (*backendKind == BackendKind::Cuda && !cudaPasses.empty()) {
    PassManager fuse;
    if (Status s = fuse.addPipeline(cudaPasses.substr(1), ""); !s.ok()) return cli::fail("run", s.error());
    std::vector<Graph*> programs;
    for (auto& r : rankGraphs) programs.push_back(r.get());
    if (programs.empty()) programs.push_back(step.get());
    for (Graph* p : programs)
      if (Status s = fuse.run(*p); !s.ok()) return cli::fail("run", cat(path, ": ", s.error()));
    pipeline += (rankGraphs.empty() ? "" : ",partition") + cudaPasses;
  }

  // Data.
  const std::string splitName = cli::flagOrFieldName(flags)("split"), splitSetting = cat(splitName, "=", config.split);
  const std::string dataField = cli::flagOrFieldName(flags)("data_path");
  auto data = openTrainingData(config, splitName, dataField.rfind("--", 0) == 0 ? dataField : cat(path, ": ", dataField),
                               model->gpt);
  if (!data) return cli::fail("run", data.error());
  // Evaluation reads its own copy of the datasets (the windows of the valid and test splits).
  std::optional<DatasetBatches> validBatches, testBatches;
  const uint64_t totalDocs = data->documents(&DocSplits::train) + data->documents(&DocSplits::valid) +
                             data->documents(&DocSplits::test);
  if (*evalInterval > 0 && data->documents(&DocSplits::valid) == 0) {
    if (flags.has("eval-interval"))
      return cli::fail("run", cat("--eval-interval: the validation split is empty (", splitSetting,
                                  " over ", totalDocs, " documents); give it a share, e.g. 949,50,1"));
    // The model file's eval_interval, as Megatron-LM's: no validation data, no evaluation.
    if (!job || job->world.rank == 0)
      std::cout << "no evaluation: the validation split of " << splitSetting << " is empty (the model file's "
                << "eval_interval " << *evalInterval << " is not applied)" << std::endl;
    *evalInterval = 0;
  }
  if (*evalInterval > 0) {
    for (auto [split, target, what] : {std::tuple{&DocSplits::valid, &validBatches, "validation"},
                                       std::tuple{&DocSplits::test, &testBatches, "test"}}) {
      if (data->documents(split) == 0) continue;
      auto parts = data->parts(split);
      if (!parts) return cli::fail("run", parts.error());
      target->emplace(std::move(*parts), static_cast<uint32_t>(config.seqLength), config.seed);
      if (Status s = (*target)->status(); !s.ok())
        return cli::fail("run", cat("the ", what, " split (", splitSetting, "): ", s.error(), "; give that split more "
                                    "documents (", splitName, "), a shorter --seq-length, or --eval-interval 0"));
    }
  }
  auto trainParts = data->parts(&DocSplits::train);
  if (!trainParts) return cli::fail("run", trainParts.error());
  if (trainParts->size() != data->entries.size())
    for (size_t i = 0; i < data->entries.size(); ++i)
      if (data->splits[i].train.size() == 0)
        return cli::fail("run", data->numDocs(i) == 0
                                    ? cat("the dataset ", data->entries[i].prefix, " holds no documents; make it again from "
                                          "text that has some (tpc prepare), or leave it out of ", dataField)
                                    : cat("the training split (", splitSetting, ") of ", data->entries[i].prefix, " is empty (",
                                          data->numDocs(i), " documents); give it a share (", splitName, ")"));
  DatasetBatches batches(std::move(*trainParts), static_cast<uint32_t>(config.seqLength), config.seed);
  batches.keepRecent(static_cast<size_t>(2 * config.globalBatch));  // a step read ahead of a save, for takenAt
  if (Status s = batches.status(); !s.ok())
    return cli::fail("run", cat("the training split (", splitSetting, "): ", s.error(), "; give it more documents (",
                                splitName, ") or a shorter --seq-length"));
  const bool speaks = !job || job->world.rank == 0;  // under mpirun, rank 0 alone logs and writes files
  if (speaks) {
    // Files this run writes, checked before any work: writable, none of them an input, no two the same file
    // (the dataset is read through a memory map: truncating it under the run would crash it).
    std::vector<std::pair<std::string, std::string>> outputs;  // flag, file
    for (const char* f : {"log-jsonl", "dump-batches", "profile-csv"})
      if (flags.has(f)) outputs.push_back({f, flags.get(f)});
    std::vector<std::pair<std::string, std::string>> inputs = {{"the model file", path}};
    for (const DataBlendEntry& e : data->entries)
      for (const char* ext : {".bin", ".idx"}) inputs.push_back({"the dataset", e.prefix + ext});
    for (size_t i = 0; i < outputs.size(); ++i) {
      const auto& [flag, file] = outputs[i];
      // A file inside the --save folder is kept, unless a save would replace or delete it.
      if (const auto rel = flags.has("save") ? cli::pathInFolder(file, flags.get("save")) : std::filesystem::path();
          !rel.empty() && ownedBySave(rel.begin()->string()))
        return cli::fail("run", cat("--", flag, " ", file, " is where --save ", flags.get("save"), " keeps its checkpoints (",
                                    rel.begin()->string(), "): a save would replace or delete it; pick another file"));
      if (Status s = cli::checkOutputFile("--" + flag, file); !s.ok()) return cli::fail("run", s.error());
      for (const auto& [what, in] : inputs)
        if (cli::sameFile(file, in))
          return cli::fail("run", cat("--", flag, " ", file, " is ", what, " (", in, "): writing it would destroy it; "
                                      "pick another file"));
      if (checkpoint && cli::insideFolder(file, checkpoint->path))
        return cli::fail("run", cat("--", flag, " ", file, " is inside the checkpoint --load reads (", checkpoint->path,
                                    "): pick a file outside it"));
      for (size_t j = 0; j < i; ++j)
        if (cli::sameFile(file, outputs[j].second))
          return cli::fail("run", cat("--", flag, " and --", outputs[j].first, " name one file (", file,
                                      "): give each its own"));
    }
    // A fresh run's log replaces an earlier run's lines (a resumed run appends to them): say so, as it is not undone.
    if (flags.has("log-jsonl") && (!checkpoint || checkpoint->state.iteration == 0)) {
      std::error_code ec;
      if (truncatableFile(flags.get("log-jsonl")) && std::filesystem::file_size(flags.get("log-jsonl"), ec) > 0) {
        std::ifstream old(flags.get("log-jsonl"));
        const int64_t lines = std::count(std::istreambuf_iterator<char>(old), std::istreambuf_iterator<char>(), '\n');
        std::cerr << "tpc run: warning: --log-jsonl " << flags.get("log-jsonl") << " holds " << lines << " line"
                  << (lines == 1 ? "" : "s") << " of an earlier run; this run's first logged step replaces them (to "
                  << "keep them, name another file; a run resumed with --load appends instead)" << std::endl;
      }
    }
    if (flags.has("save")) {
      if (Status s = checkSaveFolderIsFree(flags.get("save"), checkpoint, flags.on("finetune")); !s.ok()) return cli::fail("run", s.error());
      if (Status s = checkCheckpointFolder(flags.get("save")); !s.ok()) return cli::fail("run", s.error());
    }
    if (flags.has("dump-batches")) batches.dumpTo(flags.get("dump-batches"));
  }
  // The metrics server and the TensorBoard folder before the backend's compile: a port that is taken or a folder
  // that cannot be written is found now.
  std::unique_ptr<TensorBoardWriter> tensorboard;
  if (flags.has("tensorboard-dir") && speaks) {
    auto t = TensorBoardWriter::open(flags.get("tensorboard-dir"));
    if (!t) return cli::fail("run", t.error());
    tensorboard = std::move(*t);
  }
  std::unique_ptr<MetricsServer> metrics;
  if (flags.has("metrics-port") && speaks) {
    auto port = flags.getInt("metrics-port", 1, 65535);
    if (!port) return cli::fail("run", port.error());
    auto m = MetricsServer::start(static_cast<int>(*port));
    if (!m) return cli::fail("run", m.error());
    metrics = std::move(*m);
  }

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
  std::unique_ptr<Backend> backend;
  // A process of an mpirun job that fails once the processes met ends the job before its backend is destroyed:
  // destroying NCCL communicators that other processes still wait on may itself wait.
  struct EndJobOnFailure {
    MpiJob* job;
    bool succeeded = false;
    ~EndJobOnFailure() {
      if (job && job->training && !succeeded) endJob(*job, 1);
    }
  } endJobOnFailure{job};
#ifdef TPC_HAVE_CUDA
  if (*backendKind == BackendKind::Cuda) {
    CudaOptions cuda;
    cuda.seed = config.seed;
    cuda.collectives = flags.get("collectives");
    cuda.collectiveTimeoutSeconds = *collectiveTimeout;
    cuda.profileStep = *profileStep;
    if (speaks) cuda.profileCsv = flags.get("profile-csv");
    cuda.collectiveStream = !flags.on("one-stream");
    if (cudaProcess) {  // mesh rank world.rank on the GPU of its local rank, NCCL ids through MPI
      cuda.processRank = job->world.rank;
      cuda.device = processDevice();
      cuda.allGatherWorld = job->allGather();
    }
    backend = createCudaBackend(std::move(rankGraphs), cuda);
  }
#endif
  if (job && !rankGraphs.empty() && *backendKind == BackendKind::Cpu) {
    // One process per rank: this one runs the rank mpirun numbered it, its collectives through MPI.
    auto comm = cpu::createMpiCommunicator(step->mesh(), job->world);
    if (!comm) return cli::fail("run", comm.error());
    mesh.localRank = job->world.rank;
    mesh.communicator = *comm;
    mesh.allGatherWorld = job->allGather();
  }
  if (!backend)
    backend = rankGraphs.empty() ? createCpuBackend(cpu) : createCpuMeshBackend(std::move(rankGraphs), cpu, mesh);
  if (Status s = checkStateFitsInMemory(*step, cpu.fp64 ? 8 : 4, physicalMemoryBytes(), path); !s.ok())
    return cli::fail("run", s.error());
  const double buildSeconds = secondsSince(runStart);
  const auto stateStart = std::chrono::steady_clock::now();
  TensorMap state;
  int64_t numParams = 0;
  for (const Value* p : model->forward->params()) numParams += p->type().numel();
  // Checkpoints store every state tensor in the model's own (unsharded) parameter layout.
  std::map<std::string, Shape> layout;
  for (const Value* p : model->forward->params()) layout[p->name()] = p->shape();
  std::vector<CheckpointTensor> checkpointTensors;
  for (const Value* p : step->params()) {
    std::string base = p->name();
    for (const char* suffix : {".adam_m", ".adam_v"})
      if (llvm::StringRef(base).endswith(suffix)) base.resize(base.size() - std::strlen(suffix));
    Shape shape = layout.count(base) ? layout[base] : p->shape();
    if (model->gpt) shape = gptStoredShape(*model->gpt, base, shape);
    checkpointTensors.push_back({p->name(), shape});
    bool moment = base != p->name();
    if (!checkpoint || (moment && flags.on("finetune"))) {
      state[p->name()] = initParam(*p, config.seed);
      continue;
    }
    auto t = checkpointTensor(*checkpoint, p->name(), shape, p->type());
    if (!t && moment && !checkpoint->tensors.find(p->name()))
      return cli::fail("run", t.error() + "; to start training from its parameters alone, add --finetune");
    if (!t) return cli::fail("run", t.error());
    // A NaN read here showed only steps later, as a divergence of this run's.
    if (t->dtype() == DType::f32)
      if (Status s = requireFiniteWeights(*t, checkpoint->path + "/model.safetensors", p->name(),
                                          "a checkpoint with non-finite values cannot be trained on; load an earlier "
                                          "iter_N folder, from before the run diverged");
          !s.ok())
        return cli::fail("run", s.error());
    state[p->name()] = std::move(*t);
  }
  if (checkpoint && !flags.on("finetune")) {
    if (!job || job->world.rank == 0)
      for (const cli::ResumeDifference& d : cli::resumeDifferences(checkpoint->state.settings, config, &flags)) {
        // Megatron-LM's --override-opt_param-scheduler: the schedule's changes are what was asked for.
        const bool asked = flags.on("override-opt_param-scheduler") && d.ofSchedule();
        std::cerr << "tpc run: " << (asked ? "note" : "warning") << ": resuming " << checkpoint->path << ": " << d.line
                  << std::endl;
      }
    // The counts of the blend saved, taken only for that blend: one resumed under another data path, split or sequence
    // length replays the new blend's order (as before data_taken existed), the change warned of above.
    const std::map<std::string, std::string> now = cli::resumeSettings(config), &then = checkpoint->state.settings;
    bool sameData = !then.empty();
    for (const char* key : {"data-path", "split", "seq-length"})
      sameData &= then.count(key) && now.count(key) && then.at(key) == now.at(key);
    if (Status s = batches.seek(checkpoint->state.dataPosition,
                                sameData ? checkpoint->state.dataTaken : std::vector<uint64_t>{});
        !s.ok())
      return cli::fail("run", cat(checkpoint->path, "/state.json: error: data_position ", checkpoint->state.dataPosition,
                                  " cannot resume the training data: ", s.error(), "; the file is damaged: load an "
                                  "earlier iter_N folder"));
    std::cout << "resuming from " << checkpoint->path << " (iteration " << checkpoint->state.iteration << ")\n";
  } else if (checkpoint) {
    std::cout << "fine-tuning from " << checkpoint->path << ": its parameters (step, AdamW state and data order start "
              << "anew)\n";
  }
  const double stateSeconds = secondsSince(stateStart);
  const auto prepareStart = std::chrono::steady_clock::now();
  if (Status s = backend->prepare(*step, state); !s.ok()) return cli::fail("run", s.error());
  const double prepareSeconds = secondsSince(prepareStart);

  std::cout << "tpc run " << path << ": " << numParams << " parameters, training step of " << step->numNodes()
            << " ops on backend " << backend->name() << (step->mesh().empty() ? "" : " over " + step->mesh().str())
            << "\n"
            << (step->mesh().empty() ? "" : "  passes: " + pipeline + "\n") << "  batch: micro " << config.microBatch << " x accumulation " << *accum << " x dp " << config.dp << " = global "
            << config.globalBatch << " sequences of " << config.seqLength << " tokens\n"
            << describeData(*data, batches.windows())
            << "  lr " << config.lr
            << (config.decayStyle == "constant" ? std::string() : cat(" -> ", config.minLr))  // constant: no decay
            << " (" << config.decayStyle << ", warmup "
            << config.warmupIters << "), " << config.trainIters << " steps"
            // The model file's warmup may outlast a short trial run (a longer one given by flag is refused).
            << (config.warmupIters > config.trainIters
                    ? cat("; the warmup is longer than the run: the lr rises to ",
                          config.lr * static_cast<double>(config.trainIters) / static_cast<double>(config.warmupIters),
                          " and does not decay (--lr-warmup-iters sets a shorter one)")
                    : std::string())
            << "\n"
            << std::fixed << std::setprecision(1) << "  startup: step built in " << buildSeconds << "s, initial state in "
            << stateSeconds << "s, backend prepared in " << prepareSeconds << "s" << std::defaultfloat
            << std::setprecision(6) << std::endl;
  auto ordinal = [](int64_t n) {
    const int64_t tens = n % 100, ones = n % 10;
    const char* suffix = tens >= 11 && tens <= 13 ? "th" : ones == 1 ? "st" : ones == 2 ? "nd" : ones == 3 ? "rd" : "th";
    return std::to_string(n) + suffix;
  };
  if (lossScaling)
    std::cout << "  precision fp16: dynamic loss scale " << lossScaling->initial << " (doubled after "
              << lossScaling->window << " finite steps, halved "
              << (lossScaling->hysteresis == 1 ? std::string("at every overflow")
                                               : "from the " + ordinal(lossScaling->hysteresis) +
                                                     " overflow since it last doubled")
              << ", minimum " << lossScaling->min << ")"
              << std::endl;

  TrainerSettings settings;
  settings.trainIters = config.trainIters;
  settings.logInterval = config.logInterval;
  settings.stepLines = !flags.on("quiet");
  settings.lr.maxLr = config.lr;
  settings.lr.minLr = config.minLr;
  settings.lr.warmupIters = config.warmupIters;
  settings.lr.decayIters = config.decayIters > 0 ? config.decayIters : config.trainIters;
  settings.lr.style = config.decayStyle;
  settings.logJsonl = speaks ? flags.get("log-jsonl") : "";
  if (*backendKind == BackendKind::Cuda) {
    // Model FLOPs per token: 6 per parameter (forward + backward) plus attention's 12 * layers * hidden * seq
    // (PaLM's estimate). The peak is this GPU's for the precision the matmuls run in (dense, no sparsity).
    double attention = model->gpt ? 12.0 * static_cast<double>(model->gpt->layers * model->gpt->hidden * config.seqLength) : 0;
    settings.flopsPerToken = 6.0 * static_cast<double>(numParams) + attention;
    // A run on N GPUs (NCCL, in one process or a process each) divides by N peaks; virtual ranks share one.
    const int64_t gpus = std::max<int64_t>(backend->gpusInRun(), 1);
    const PeakFlops peak = peakFlopsFor(backend->gpuName(), precision);
    settings.peakFlops = static_cast<double>(gpus) * peak.flops;
    settings.peakName = (gpus > 1 ? cat(gpus, " x ") : std::string()) + peak.label;
  }
  if (checkpoint) {
    settings.firstIter = checkpoint->state.iteration + 1;
    settings.start.skippedSteps = checkpoint->state.skippedSteps;
    if (lossScaling) {  // a checkpoint of an fp16 run carries its scale; another starts at --initial-loss-scale
      settings.start.lossScale = checkpoint->state.lossScale;
      settings.start.lossScaleGoodSteps = checkpoint->state.lossScaleGoodSteps;
      settings.start.lossScaleHysteresisLeft = checkpoint->state.lossScaleHysteresisLeft;
    }
  }
  settings.lossScaling = lossScaling;
  if (metrics || tensorboard) {
    settings.publish = [&](const std::map<std::string, double>& f) {
      if (metrics) metrics->publish(f);
      // A full disk costs the event file, not the run (the JSONL log, when asked for, still fails the run).
      if (tensorboard)
        if (Status s = tensorboard->publish(f); !s.ok())
          std::cerr << "tpc run: warning: " << s.error() << "; no more TensorBoard events are written" << std::endl;
    };
  }
  if (metrics) std::cout << "metrics: http://127.0.0.1:" << metrics->port() << "/metrics" << std::endl;
  if (tensorboard)
    std::cout << "tensorboard: event files in " << flags.get("tensorboard-dir") << " (tensorboard --logdir "
              << flags.get("tensorboard-dir") << ")" << std::endl;
  std::unique_ptr<Evaluator> evaluator;
  if (*evalInterval > 0) {
    Result<std::unique_ptr<Evaluator>> e = makeError("no evaluator");
#ifdef TPC_HAVE_CUDA
    // On the GPU the evaluation runs there too, on the training's ranks and GPUs: the forward graph in the
    // training's precision, sharded as the training step is (the same mesh, policy and placements), each
    // rank reading its parameter blocks in the training backend's memory (CudaOptions::stateSource), or
    // copying them device to device before each evaluation where the blocks differ.
    if (*backendKind == BackendKind::Cuda) {
      CudaOptions cuda;
      cuda.stateSource = backend.get();
      // A cast a parameter at a time, where the forward reads it: one multi-tensor cast at the start would keep
      // every 16-bit copy live through the whole forward (2.9 GiB of gpt2-xl's), where the training's AdamW
      // keeps them anyway but evaluation has nothing else to hold.
      cuda.multiTensorCasts = false;
      cuda.seed = config.seed;
      cuda.verbose = false;
      cuda.collectives = flags.get("collectives");
      cuda.collectiveTimeoutSeconds = *collectiveTimeout;
      if (job) cuda.device = processDevice();
      auto makeBackend = [&](Graph& g) -> Result<std::unique_ptr<Backend>> {
        if (g.mesh().empty()) return createCudaBackend({}, cuda);
        TPC_ASSIGN(auto ranks, partitionRanks(g, ownRank));
        CudaOptions sharded = cuda;
        if (cudaProcess) {
          sharded.processRank = job->world.rank;
          sharded.allGatherWorld = job->allGather();
        }
        return createCudaBackend(std::move(ranks), sharded);
      };
      e = Evaluator::create(*model->forward, model->lossOutput, makeBackend, evaluationPipeline(*model, precision, *tpPolicy),
                            *backend);
    }
#endif
    if (*backendKind != BackendKind::Cuda) e = Evaluator::create(*model->forward, model->lossOutput, cpu);
    // Evaluation is on by default where the model file asks for it: say how to turn it off (its setup can
    // still fail on a GPU: cuDNN and cuBLASLt plans, a workspace, and an arena of its own where the training's
    // is smaller).
    if (!e)
      return cli::fail("run", cat("evaluation: ", e.error(),
                                  flags.has("eval-interval") ? std::string()
                                                             : cat(" (the model file's eval_interval ", *evalInterval,
                                                                   " asks for it; --eval-interval 0 turns it off)")));
    evaluator = std::move(*e);
    std::cout << "  eval: every " << *evalInterval << " steps, " << *evalIters << " batches of the validation split"
              << (*accum > 1 ? cat(" (global batches: ", evalMicroBatches, " micro-batches)") : std::string()) << ", on "
              << evaluator->where() << std::endl;
    settings.evalInterval = *evalInterval;
    settings.evaluate = [&]() -> Result<double> {
      TPC_TRY(validBatches->seek(0, {}));  // the same batches every time: comparable numbers
      return evaluator->meanLoss(*backend, *validBatches, evalMicroBatches);
    };
  }
  const std::string saveDir = flags.get("save");
  // rowsReadAhead: windows already read for the next step (TrainerSettings::afterStep), not yet trained on.
  auto saveAt = [&](int64_t it, const OptimizerProgress& progress, int64_t rowsReadAhead) -> Status {
    if (job && job->world.rank != 0) {
      // Rank 0 writes the checkpoint; the others give it their blocks (readState gathers across processes).
      for (const CheckpointTensor& t : checkpointTensors) TPC_TRY(backend->readState(t.name).status());
      return {};
    }
    CheckpointState cs;
    cs.iteration = it;
    cs.skippedSteps = progress.skippedSteps;
    cs.lossScale = progress.lossScale;
    cs.lossScaleGoodSteps = progress.lossScaleGoodSteps;
    cs.lossScaleHysteresisLeft = progress.lossScaleHysteresisLeft;
    cs.dataPosition = batches.position() - static_cast<uint64_t>(rowsReadAhead);
    cs.dataTaken = batches.takenAt(cs.dataPosition);
    cs.seed = config.seed;
    cs.model = path;
    cs.config = cat("tp=", config.tp, " dp=", config.dp, " sp=", config.sp, " micro=", config.microBatch,
                    " global=", config.globalBatch, " seq=", config.seqLength, " lr=", config.lr);
    cs.settings = cli::resumeSettings(config);
    TPC_ASSIGN(std::string modelBytes, serializeModel(*model, false));
    const auto saveStart = std::chrono::steady_clock::now();
    int64_t savedBytes = 0;
    TPC_TRY(saveCheckpoint(saveDir, cs, checkpointTensors,
                           [&](const std::string& n) {
                             auto t = backend->readState(n);
                             if (t.ok()) savedBytes += static_cast<int64_t>(t->bytes());
                             return t;
                           },
                           *keep, {{"model.fb", modelBytes}}));
    // What a save costs the run (gpt2-xl's parameters and AdamW moments are 18 GB), as Megatron-LM reports it.
    if (settings.logInterval > 0 && settings.stepLines) {
      std::ostringstream seconds;
      seconds << std::fixed << std::setprecision(1)
              << std::chrono::duration<double>(std::chrono::steady_clock::now() - saveStart).count();
      std::cout << "saved checkpoint " << saveDir << " iteration " << it << " (" << formatBytes(savedBytes) << " in "
                << seconds.str() << " s)" << std::endl;
    }
    return {};
  };
  // Where --exit-interval, --exit-duration-in-mins or --exit-signal-handler end the run (every process stops after
  // the same step: under mpirun the reasons are gathered, and any process's ends the run on all of them).
  cli::ExitReason stopReason = cli::ExitReason::None;
  int64_t stopIteration = 0;
  if (earlyExit->any())
    settings.stopAfter = [&](int64_t it) -> Result<bool> {
      uint8_t reason = static_cast<uint8_t>(earlyExit->reasonAfter(it));
      if (job) {
        std::vector<uint8_t> all(static_cast<size_t>(job->world.size));
        TPC_TRY(job->allGather()(&reason, 1, all.data()));
        reason = *std::max_element(all.begin(), all.end());
      }
      stopReason = static_cast<cli::ExitReason>(reason);
      stopIteration = it;
      return stopReason != cli::ExitReason::None;
    };
  auto savesAt = [&](int64_t it) {
    return it == config.trainIters || (*saveInterval > 0 && it % *saveInterval == 0) ||
           (stopReason != cli::ExitReason::None && it == stopIteration);
  };
  if (!saveDir.empty()) {
    settings.afterStep = [&](int64_t it, const OptimizerProgress& progress, int64_t rowsReadAhead) -> Status {
      return savesAt(it) ? saveAt(it, progress, rowsReadAhead) : Status{};
    };
    settings.afterStepPrintsAt = savesAt;
  }
  if (flags.on("save-initial")) {
    OptimizerProgress initial;
    if (lossScaling) initial.lossScale = lossScaling->initial;
    if (Status s = saveAt(0, initial, 0); !s.ok()) return cli::fail("run", s.error());
  }
  // The windows of the steps trained so far (the data position a checkpoint would record), for --dump-batches.
  uint64_t trainedPosition = batches.position();
  settings.afterStep = [&, save = settings.afterStep](int64_t it, const OptimizerProgress& progress,
                                                      int64_t rowsReadAhead) -> Status {
    trainedPosition = batches.position() - static_cast<uint64_t>(rowsReadAhead);
    return save ? save(it, progress, rowsReadAhead) : Status{};
  };
  settings.onNonFinite = *onNan;
  if (job) job->training = true;
  auto report = train(*backend, *step, batches, settings, std::cout);
  if (!report) return cli::fail("run", report.error());
  if (Status s = batches.finishDump(trainedPosition); !s.ok()) return cli::fail("run", s.error());
  if (report->lastIteration < config.trainIters) {
    // No test evaluation at an early stop (the run is not over): say where it stopped and how to go on.
    std::printf("stopped after step %lld of %lld: %s; %s\n", static_cast<long long>(report->lastIteration),
                static_cast<long long>(config.trainIters), earlyExit->describe(stopReason, stopIteration).c_str(),
                saveDir.empty() ? "nothing saved (no --save)"
                                : cat("checkpoint in ", saveDir, "; go on with the same command and --load ", saveDir).c_str());
  } else if (evaluator && !testBatches)
    std::printf("no test evaluation: the test split of %s is empty\n", splitSetting.c_str());
  if (evaluator && testBatches && report->lastIteration == config.trainIters) {
    auto test = evaluator->meanLoss(*backend, *testBatches, evalMicroBatches);
    if (!test) return cli::fail("run", test.error());
    std::printf("test loss %.4f | test ppl %.3f (%lld batches of the test split)\n", *test, std::exp(*test),
                static_cast<long long>(*evalIters));
    if (settings.publish)
      settings.publish({{"step", double(config.trainIters)}, {"test_loss", *test}, {"test_ppl", std::exp(*test)}});
    if (!settings.logJsonl.empty())
      std::ofstream(settings.logJsonl, std::ios::app) << "{\"step\": " << config.trainIters << ", \"test_loss\": " << jsonNumber(*test)
                                                      << ", \"test_ppl\": " << jsonNumber(std::exp(*test)) << "}\n";
  }
  const auto& losses = report->losses;
  // Every step run is counted, the skipped ones too (they read their batch and took their time).
  std::string aside;
  if (report->evalSeconds > 0) aside = formatDuration(report->evalSeconds) + " of it evaluating";
  if (report->saveSeconds >= 0.05)
    aside += (aside.empty() ? "" : ", ") + formatDuration(report->saveSeconds) + (aside.empty() ? " of it" : "") + " saving";
  std::printf("done: %zu steps in %s%s, %.0f tokens/s", losses.size() + report->skippedSteps.size(),
              formatDuration(report->seconds).c_str(), aside.empty() ? "" : cat(" (", aside, ")").c_str(),
              report->tokensPerSecond);
  // (An early stop may come before any step was applied: every one so far skipped.)
  if (!losses.empty())
    std::printf("; loss %.4f -> %.4f (%.1f%% %s)", losses.front(), losses.back(),
                100.0 * std::abs(1.0 - losses.back() / losses.front()), losses.back() > losses.front() ? "higher" : "lower");
  if (!report->skippedSteps.empty())
    std::printf("; %zu of them skipped (non-finite), their updates dropped", report->skippedSteps.size());
  std::printf("\n");
  if (backend->launchesPerStep() >= 0)
    std::printf("  GPU: %lld kernel launches and library calls per step, replayed as one CUDA graph; %.2f GiB of GPU memory in use\n",
                static_cast<long long>(backend->launchesPerStep()),
                static_cast<double>(backend->deviceMemoryInUse()) / (1ull << 30));
  endJobOnFailure.succeeded = true;
  return 0;
}

// `tpc run`, or one process of `mpirun -np N tpc run` (rank 0 prints and writes the logs and checkpoints).
int runRun(std::vector<std::string> args) {
  if (!mpi::launchedByMpirun()) return runRunIn(std::move(args), nullptr);
  auto world = mpi::init();
  if (!world) return cli::fail("run", world.error());
  MpiJob job{*world};
  if (job.world.rank != 0) {
    std::fflush(stderr);
    job.stderrFd = dup(2);
    job.captured = std::tmpfile();
    if (!job.captured || !std::freopen("/dev/null", "w", stdout) || dup2(fileno(job.captured), 2) < 0) return 1;
  }
  int rc = runRunIn(std::move(args), &job);
  std::fflush(stdout);
  // A process that fails while training may leave the others waiting in a collective for it: end the job.
  if (rc != 0 && job.training) endJob(job, rc);
  mpi::finalize();
  return rc;
}

cli::SubcommandRegistration reg("run", "train a model file (on the GPU when there is one, else the CPU; flags as in Megatron-LM)", runRun);

}  // namespace
}  // namespace tpc
