// CudaBackend: per-rank programs (lowering, memory plan, launches with resolved addresses), the CUDA
// graph capture of all ranks' launches with the virtual-rank collectives between them, and the host side
// of a step (batch in, replay, outputs out).
#include "runtime/cuda/cuda_backend.h"

#include <cuda_runtime_api.h>
#include <unistd.h>

#include <chrono>
#include <functional>
#include <cstdio>
#include <cstdlib>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <set>
#include <thread>
#include <unordered_map>
#include <utility>

#include "ir/printer.h"
#include "passes/builtin_passes.h"
#include "runtime/cuda/adamw_groups.h"
#include "runtime/cuda/candidate_timing.h"
#include "runtime/cuda/cast_groups.h"
#include "runtime/cuda/comm_stream_schedule.h"
#include "runtime/cpu/cpu_mesh_backend.h"
#include "runtime/cpu/shared_memory_communicator.h"
#include "runtime/cuda/cublaslt_matmul.h"
#include "runtime/cuda/cuda_libraries.h"
#include "runtime/cuda/cudnn_attention.h"
#include "runtime/cuda/lowering.h"
#include "runtime/cuda/memory_plan.h"
#include "runtime/cuda/nonfinite_scan.h"
#include "runtime/cuda/param_draw.h"
#include "runtime/cuda/nvrtc_compiler.h"
#include "runtime/cuda/step_profile.h"
#include "runtime/cuda/kernels/codegen.h"
#include "runtime/cuda/kernels/family_lowerings.h"
#include "runtime/cuda/kernels/generated_lowerings.h"
#include "runtime/cuda/virtual_collectives.h"
#include "llvm/ADT/SetVector.h"

namespace tpc {
namespace {

using namespace cuda;

#define CU_TRY(expr, ...)                                                                    \
  do {                                                                                       \
    cudaError_t e_ = (expr);                                                                 \
    if (e_ != cudaSuccess) return makeError("cuda: ", __VA_ARGS__, ": ", cudaGetErrorString(e_)); \
  } while (0)

std::string mib(int64_t b) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f MiB", static_cast<double>(b) / (1 << 20));
  return buf;
}

struct Launch {
  enum Kind { Kernel, Matmul, Memset, Copy, Nccl, Cudnn } kind = Kernel;
  CUfunction fn = nullptr;
  Dim3 grid, block;
  uint32_t clusterX = 1;  // the kernel's compile-time cluster width (KernelSpec::clusterX)
  uint32_t smem = 0;
  std::vector<uint64_t> argv;
  // TensorMap arguments: argv[i] is an index into `maps` (mapArg[i]), whose 128 bytes are the parameter.
  struct alignas(64) Map {
    uint64_t words[16];
  };
  std::vector<Map> maps;
  std::vector<bool> mapArg;
  int matmul = -1;
  int cudnn = -1;  // Cudnn: the binding (CudnnAttention::bind) it runs
  EpilogueBuffers epi;  // a matmul_epilogue's bias, aux and residual
  const void* a = nullptr;
  const void* b = nullptr;
  void* c = nullptr;
  size_t bytes = 0;
  // Nccl: op 0 all_reduce, 1 all_gather, 2 reduce_scatter of `bytes` = element count, a -> c.
  int ncclOp = 0;
  ncclComm_t comm = nullptr;
  ncclDataType_t ncclType = ncclFloat32;
  ncclRedOp_t redOp = ncclSum;
  std::string op;    // the op it runs for (the step profile's row): "add", "fusion_group=3", "NCCL all_reduce"
  std::string what;  // the node, for errors
  std::string gemm;  // Matmul, Cudnn: the GEMM or attention call and its FLOPs (the step profile's per-GEMM table)
  double flops = 0;
  // Checking mode (findFirstNonFinite): (rank, node index) whose results are complete after this launch.
  std::vector<std::pair<size_t, int>> checks;
  // For the communication stream's schedule (comm_stream_schedule.h): the collective this launch belongs
  // to (-1: compute) and the device bytes it reads and writes.
  int collective = -1;
  std::vector<ByteRange> reads, writes;
};

// What one GPU holds besides the ranks' buffers: its stream, cuBLASLt, the step word, the loaded kernels,
// the launches it replays and their CUDA graph. Virtual ranks share one; NCCL ranks have one each.
struct DeviceCtx {
  int device = 0;
  cudaStream_t stream = nullptr;
  std::unique_ptr<CublasLtMatmul> matmul;
  void* matmulWorkspace = nullptr;
  std::unique_ptr<CudnnAttention> attention;  // CudaOptions::attention: null where our kernels run it
  void* stepWord = nullptr;
  void* holdWord = nullptr;  // nonzero: the gated AdamW kernels leave the state alone (checking mode)
  void* freshWord = nullptr;  // nonzero: the AdamW kernels' 16-bit copies hold the parameters' casts (copiesFresh_)
  // Page-locked host memory for the step's small transfers (pinnedLayout()): the batch and the step and hold
  // words on the way in, rank 0's outputs on the way out, copied right behind the step so that finishStep()
  // reads host memory. Copies from pageable memory each cost the host a synchronous staging; between two
  // steps the device waits for all of them.
  void* pinned = nullptr;
  size_t stepOffset = 0, holdOffset = 0, freshOffset = 0;
  double lastWaitS = 0;  // how long finishStep() last waited for the step
  std::unordered_map<std::string, CUfunction> functions;
  std::vector<Launch> launches;
  // The collectives' stream in the captured step (CudaOptions::collectiveStream), its fork and join
  // events (one each per collective) and where they go.
  cudaStream_t comm = nullptr;
  std::vector<cudaEvent_t> commEvents;
  CommSchedule schedule;
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  std::vector<HostTensor> staging;
  cudaEvent_t replayStart = nullptr, replayEnd = nullptr;  // around each graph replay
  bool replayTimed = false;
  bool stepReplayed = false;  // the step in flight is a timed replay (not a debug or profiled step)
  std::vector<TimedLaunch> profile;  // the profiled step's launches (profileStep)
};

Result<ncclDataType_t> ncclType(DType t) {
  switch (t) {
    case DType::f32: return ncclFloat32;
    case DType::bf16: return ncclBfloat16;
    case DType::f16: return ncclFloat16;
    case DType::f64: return ncclFloat64;
    case DType::i32: return ncclInt32;
    case DType::i64: return ncclInt64;
    default: return makeError("NCCL collectives of ", dtypeName(t), " are not supported");
  }
}

struct Rank {
  std::unique_ptr<Graph> graph;
  llvm::DenseMap<const Value*, void*> addr;
  std::map<std::string, std::pair<const Value*, void*>> params;  // name -> (param value, buffer)
  std::vector<void*> allocations;
  void* arena = nullptr;
  int64_t arenaBytes = 0, stateBytes = 0, inputBytes = 0;
  bool arenaBorrowed = false;  // `arena` is CudaOptions::stateSource's (borrowArenas): not ours to free
  std::vector<std::vector<Launch>> segments;  // split at cross-rank collectives
  std::vector<const Node*> collectives;
  // Fusion groups (ir/fusion_group.h): each runs as one kernel at its last member; the other members launch
  // nothing, and values read only inside a group get no buffer.
  std::vector<FusionGroup> groups;
  llvm::DenseMap<const Node*, const FusionGroup*> groupOf;
  std::vector<int> collectiveIndex;  // their node indices
  // Parameters and optimizer state live in one block. The multi-tensor AdamW kernels (adamw_groups.h) leave
  // it alone on a non-finite step; a parameter updated otherwise (by an ungated node) is copied aside
  // before each step into `kept`, and a non-finite step gets it back (backend.h).
  void* state = nullptr;
  void* kept = nullptr;
  int64_t keptBytes = 0;
  struct Kept {
    std::string name;
    int64_t offset = 0, bytes = 0;  // in `kept`
  };
  std::vector<Kept> keptParams;
  // The casts of parameters whose 16-bit copies the AdamW kernels keep (adamw_groups.h): their results live
  // in the state block, after the parameters, from one step to the next.
  llvm::SetVector<const Value*> copies;
  // Parameters read from CudaOptions::stateSource's buffers: not in `state`, never written here.
  std::set<std::string> borrowed;
  std::vector<size_t> inputOffset;  // graph input k's place in its device's pinned block
  // Rank 0's outputs that finishStep() returns (those that do not update a parameter): name, value, and
  // their place in the pinned block.
  struct Out {
    std::string name;
    const Value* value = nullptr;
    size_t offset = 0;
  };
  std::vector<Out> outs;
};

class CudaBackend final : public Backend {
 public:
  CudaBackend(std::vector<std::unique_ptr<Graph>> graphs, CudaOptions options) : options_(std::move(options)) {
    for (auto& g : graphs) {
      ranks_.emplace_back();
      ranks_.back().graph = std::move(g);
    }
  }
  ~CudaBackend() override { release(); }

  std::string gpuName() const override { return deviceName_; }
  std::string name() const override {
    if (processMode())
      return cat("cuda (", deviceName_, ", rank ", options_.processRank, " of ", meshRanks(), " on GPU ", options_.device,
                 ", NCCL across processes)");
    return cat("cuda (", deviceName_,
               ranks_.size() > 1 ? cat(", ", ranks_.size(), nccl_ ? " ranks on their own GPUs, NCCL" : " virtual ranks") : "",
               ")");
  }
  int64_t deviceMemoryInUse() const override {
    size_t freeB = 0, total = 0;
    if (cudaMemGetInfo(&freeB, &total) != cudaSuccess) return -1;
    return static_cast<int64_t>(total - freeB);
  }
  int64_t launchesPerStep() const override { return launchCount_; }
  int64_t gpusInRun() const override {
    if (!prepared_) return 0;
    return processMode() ? meshRanks() : static_cast<int64_t>(devs_.size());
  }

  std::optional<CudaStepGraphInfo> graphInfo() const {
    if (!prepared_ || devs_.empty() || !devs_[0].graph) return std::nullopt;
    const DeviceCtx& d = devs_[0];
    CudaStepGraphInfo info;
    info.launches = static_cast<int64_t>(d.launches.size());
    for (const Launch& l : d.launches) {
      const bool gemm = l.kind == Launch::Kernel && !l.gemm.empty(), clustered = gemm && l.clusterX > 1;
      info.gemmKernels += gemm;
      info.clusteredGemmKernels += clustered;
      info.clusteredGemmBlocks += clustered ? l.grid.x : 0;
    }
    for (const Rank& rk : ranks_) {
      info.keptCopies += static_cast<int64_t>(rk.copies.size());
      info.borrowedArenas += rk.arenaBorrowed;
      info.borrowedParams += static_cast<int64_t>(rk.borrowed.size());
      for (const Node* n : rk.graph->nodes()) info.residualLayerNorms += n->op() == OpKind::LayerNorm && n->numOperands() == 4;
    }
    if (d.comm) {
      for (int c : d.schedule.collectiveOf) info.commLaunches += c >= 0;
      info.collectives = static_cast<int64_t>(d.schedule.collectives.size());
      info.forks = d.schedule.forks;
      info.joins = d.schedule.joins;
      info.overlapped = d.schedule.overlapped;
    }
    size_t nodes = 0, edges = 0;
    if (cudaGraphGetNodes(d.graph, nullptr, &nodes) != cudaSuccess) return std::nullopt;
#if CUDART_VERSION >= 13000
    if (cudaGraphGetEdges(d.graph, nullptr, nullptr, nullptr, &edges) != cudaSuccess) return std::nullopt;
#else
    if (cudaGraphGetEdges(d.graph, nullptr, nullptr, &edges) != cudaSuccess) return std::nullopt;
#endif
    info.graphNodes = static_cast<int64_t>(nodes);
    info.graphEdges = static_cast<int64_t>(edges);
    return info;
  }

  Status prepare(const Graph& step, const TensorMap& state) override {
    release();
    if (ranks_.empty()) {
      ranks_.emplace_back();
      ranks_.back().graph = step.clone();
    }
    if (processMode()) {
      const Mesh& mesh = ranks_[0].graph->mesh();
      if (ranks_.size() != 1 || mesh.empty() || options_.processRank >= mesh.numRanks() || !options_.allGatherWorld)
        return makeError("cuda backend: one process per rank runs one rank graph of a mesh, with the job's all-gather (got ",
                         ranks_.size(), " graphs for rank ", options_.processRank, " of ",
                         mesh.empty() ? std::string("no mesh") : mesh.str(), ")");
      if (options_.collectives == "virtual")
        return makeError("--collectives=virtual runs every rank in one process on one GPU, but mpirun started a process "
                         "per rank (each on a GPU of its own, through NCCL): drop --collectives=virtual, or run without mpirun");
      int count = 0;
      CU_TRY(cudaGetDeviceCount(&count), "counting GPUs");
      if (options_.device >= count)
        return makeError("rank ", options_.processRank, " is process ", options_.device, " on its machine, which has ", count,
                         count == 1 ? " GPU" : " GPUs", ": start at most one process per GPU on each machine (mpirun -np N "
                         "--map-by ppr:", count, ":node)");
    } else if (!ranks_[0].graph->mesh().empty() && ranks_[0].graph->mesh().numRanks() != static_cast<int64_t>(ranks_.size()))
      return makeError("cuda backend: ", ranks_[0].graph->mesh().str(), " has ", ranks_[0].graph->mesh().numRanks(),
                       " ranks, but ", ranks_.size(), " rank graphs were given");
    CU_TRY(cudaSetDevice(options_.device), "cannot use GPU ", options_.device);
    CU_TRY(cudaFree(nullptr), "cannot initialize GPU ", options_.device);
    cudaDeviceProp prop{};
    CU_TRY(cudaGetDeviceProperties(&prop, options_.device), "device properties");
    deviceName_ = prop.name;
    ctx_.smMajor = prop.major;
    ctx_.smMinor = prop.minor;
    ctx_.maxSharedBytes = static_cast<int64_t>(prop.sharedMemPerBlockOptin);
    ctx_.numSMs = prop.multiProcessorCount;
    ctx_.sharedPerSM = static_cast<int64_t>(prop.sharedMemPerMultiprocessor);
    // TPC_MEMBW_OFF=colreduce,colwave,vecew,lnres,lnsum,lngrad2,lnregs,lngamma,lnwide,embgrad2,xent1,adamcopy (or all) switches the memory-bound kernel variants off, for measuring.
    const char* off = std::getenv("TPC_MEMBW_OFF");
    std::string membwOff = cat(",", off ? off : "", ",");
    auto isOff = [&](const char* what) { return membwOff == ",all," || membwOff.find(cat(",", what, ",")) != std::string::npos; };
    ctx_.columnReduce = !isOff("colreduce");
    ctx_.columnReduceWave = !isOff("colwave");
    ctx_.vectorElementwise = !isOff("vecew");
    ctx_.layerNormGradBlocks = !isOff("lngrad2");
    if (isOff("lnregs")) {  // its sums in shared memory
      ctx_.layerNormGradRegColumns = ctx_.layerNormGradRegSumColumns = 0;
      ctx_.layerNormGradWide = false;
    }
    if (isOff("lngamma")) ctx_.layerNormGradGammaShared = false;  // its gamma from global memory
    if (isOff("lnwide")) ctx_.layerNormGradWide = false;  // 1024-wide rows as the settings below say
    if (const char* st = std::getenv("TPC_LN_GRAD_STAGES"); st && *st) {
      char* endp = nullptr;
      const long v = std::strtol(st, &endp, 10);
      if (*endp || v < 0 || v == 1 || v > 8)
        return makeError("TPC_LN_GRAD_STAGES=", st, ": expected 0 (rows prefetched into registers) or 2-8 (rows a warp ",
                         "in a shared-memory ring)");
      ctx_.layerNormGradStages = static_cast<int>(v);
      ctx_.layerNormGradWide = false;  // the stages asked for, at every width
    }
    // TPC_LN_GRAD_REGS=N[,M]: a lane's dgamma/dbeta sums in registers up to N columns, its dx sums up to M (N if
    // left out), for measuring (LoweringContext::layerNormGradRegColumns / RegSumColumns).
    if (const char* rg = std::getenv("TPC_LN_GRAD_REGS"); rg && *rg) {
      char* endp = nullptr;
      const long a = std::strtol(rg, &endp, 10);
      long b = a;
      bool parsed = endp != rg;
      if (parsed && *endp == ',') {
        const char* second = endp + 1;
        b = std::strtol(second, &endp, 10);
        parsed = endp != second;
      }
      if (!parsed || *endp || a < 0 || b < 0 || a > 64 || b > 64)
        return makeError("TPC_LN_GRAD_REGS=", rg, ": expected N or N,M (0-64): a lane's columns whose dgamma/dbeta ",
                         "sums (N) and dx sums (M) stay in registers");
      ctx_.layerNormGradRegColumns = static_cast<int>(a);
      ctx_.layerNormGradRegSumColumns = static_cast<int>(b);
      ctx_.layerNormGradWide = false;
    }
    ctx_.embeddingGradSegments = !isOff("embgrad2");
    foldLayerNormGradResidual_ = !isOff("lnres");
    foldLayerNormGradBiasSum_ = !isOff("lnsum");
    // The forward residual adds in the layer_norm kernel instead of the GEMMs' epilogues (cuBLASLt's C with beta 1):
    // off, slower on an H100 (the layer_norm's extra row costs more than C's read, which hides behind the math).
    foldLayerNormResidual_ = false;
    if (const char* lr = std::getenv("TPC_LN_RESIDUAL"); lr && *lr) {
      const std::string v = lr;
      if (v != "0" && v != "1")
        return makeError("TPC_LN_RESIDUAL=", v, ": expected 1 (the forward residual adds in the layer_norm kernel) or 0");
      foldLayerNormResidual_ = v == "1";
    }
    ctx_.xentOnePass = !isOff("xent1");
    const char* ownGemmEnv = std::getenv("TPC_OWN_GEMM");
    if (ownGemmEnv && *ownGemmEnv) TPC_TRY(setOwnGemmKinds(ownGemmEnv, "TPC_OWN_GEMM", &ctx_));
    else TPC_TRY(setOwnGemmKinds(options_.ownGemm, "CudaOptions::ownGemm", &ctx_));
    adamwCopies_ = !isOff("adamcopy");
    TPC_ASSIGN(driver_, driver());
    // Which attention kernels (CudaOptions::attention; TPC_ATTENTION overrides it).
    const char* attn = std::getenv("TPC_ATTENTION");
    attentionMode_ = attn && *attn ? attn : options_.attention;
    if (attentionMode_ != "auto" && attentionMode_ != "cudnn" && attentionMode_ != "tpc")
      return makeError(attn && *attn ? "TPC_ATTENTION" : "the attention option", "='", attentionMode_,
                       "' is not a choice (expected auto, cudnn or tpc)");
    compiler_ = std::make_unique<NvrtcCompiler>(prop.major * 10 + prop.minor, options_.cacheDir);
    // Collectives: NCCL with a GPU per rank, or virtual ranks sharing one GPU (device kernels).
    int deviceCount = 0;
    CU_TRY(cudaGetDeviceCount(&deviceCount), "counting GPUs");
    const size_t R = ranks_.size();
    if (options_.collectives != "auto" && options_.collectives != "virtual" && options_.collectives != "nccl")
      return makeError("--collectives=", options_.collectives, " is not a mode (expected auto, virtual or nccl)");
    nccl_ = processMode() || options_.collectives == "nccl" ||
            (options_.collectives == "auto" && R > 1 && deviceCount >= static_cast<int>(R));
    if (nccl_ && !processMode() && deviceCount < static_cast<int>(R))
      return makeError("--collectives=nccl: ", R, " ranks need ", R, " GPUs, this machine has ", deviceCount,
                       " (use --collectives=virtual to run the ranks on one GPU)");
    if (nccl_) {
      TPC_ASSIGN(ncclLib_, nccl());
    }
    commStream_ = options_.collectiveStream && meshRanks() > 1;
    devs_.resize(nccl_ ? R : 1);
    // Timing cuBLASLt's first 8 candidates per GEMM (CudaOptions::matmulAutotune; TPC_MATMUL_AUTOTUNE=0|1, or
    // N >= 2 to time the first N), and how (TPC_AUTOTUNE_SUSTAINED): read once for every device.
    const char* tune = std::getenv("TPC_MATMUL_AUTOTUNE");
    int candidates = options_.matmulAutotune ? 8 : 1;
    if (tune && *tune) {
      char* end = nullptr;
      long n = std::strtol(tune, &end, 10);
      if (*end || n < 0 || n > 64) return makeError("TPC_MATMUL_AUTOTUNE must be 0, 1 or a number of candidates up to 64, got '", tune, "'");
      candidates = n == 0 ? 1 : n == 1 ? 8 : static_cast<int>(n);
    }
    TPC_ASSIGN(CandidateTiming timing, candidateTimingFromEnv());
    // TPC_CUDNN_DETERMINISTIC=0: cuDNN's attention backward with dQ accumulated by atomics (measuring only: steps
    // then differ in their last bits from run to run).
    const char* det = std::getenv("TPC_CUDNN_DETERMINISTIC");
    const bool cudnnDeterministic = !(det && std::string(det) == "0");
    for (size_t i = 0; i < devs_.size(); ++i) {
      DeviceCtx& d = devs_[i];
      d.device = nccl_ && !processMode() ? static_cast<int>(i) : options_.device;
      CU_TRY(cudaSetDevice(d.device), "cannot use GPU ", d.device);
      CU_TRY(cudaFree(nullptr), "cannot initialize GPU ", d.device);
      TPC_ASSIGN(d.matmul, CublasLtMatmul::create(32 << 20, candidates, timing));
      CU_TRY(cudaStreamCreateWithFlags(&d.stream, cudaStreamNonBlocking), "stream");
      if (commStream_) CU_TRY(cudaStreamCreateWithFlags(&d.comm, cudaStreamNonBlocking), "communication stream");
      CU_TRY(cudaMalloc(&d.stepWord, sizeof(int64_t)), "step word");
      CU_TRY(cudaMalloc(&d.holdWord, sizeof(int32_t)), "hold word");
      CU_TRY(cudaMemset(d.holdWord, 0, sizeof(int32_t)), "hold word");
      CU_TRY(cudaMalloc(&d.freshWord, sizeof(int32_t)), "fresh word");
      CU_TRY(cudaMemset(d.freshWord, 0, sizeof(int32_t)), "fresh word");
      CU_TRY(cudaEventCreate(&d.replayStart), "event");
      CU_TRY(cudaEventCreate(&d.replayEnd), "event");
      CU_TRY(cudaMalloc(&d.matmulWorkspace, d.matmul->workspaceBytes()), "cuBLASLt workspace");
      if (attentionMode_ != "tpc") {
        // Its engine configs are timed as cuBLASLt's algorithms are, under the same switches.
        auto a = CudnnAttention::create(cudnnDeterministic, candidates > 1, timing);
        if (a.ok()) d.attention = std::move(a).value();
        else if (attentionMode_ == "cudnn") return makeError("TPC_ATTENTION=cudnn: ", a.error());
        else if (options_.verbose && i == 0) std::printf("cuda: attention through tpc's kernels (%s)\n", a.error().c_str());
      }
    }

    auto t0 = std::chrono::steady_clock::now();
    for (size_t r = 0; r < ranks_.size(); ++r) {
      std::function<bool(const Node&)> canRun;  // an epilogue cuBLASLt refuses keeps its unfused ops
      // The epilogue kinds folded (CudaOptions::matmulEpilogueKinds; TPC_MATMUL_EPILOGUES overrides it).
      const char* kinds = std::getenv("TPC_MATMUL_EPILOGUES");
      std::string only = cat(",", kinds && *kinds ? std::string(kinds) : options_.matmulEpilogueKinds, ",");
      if (only == ",all,") only.clear();
      if (options_.matmulEpilogues)
        canRun = [this, r, only](const Node& n) {
          std::string kind = n.getStr("epilogue");
          // dgelu_bgrad, whose cuBLASLt form is slower than the unfused ops (off the default list), folds where our
          // GEMM kernel runs it (TPC_OWN_GEMM) as a dgelu would.
          if (kind == "dgelu_bgrad" && ownGemm(n, ctx_)) return only.empty() || only.find(",dgelu,") != std::string::npos;
          // bgrad_a (d w^T with d's bias sum) has no cuBLASLt form: it folds where our GEMM kernel runs it (and the
          // list has it), but for the residual stream's sums: the layer_norm_grad kernel that writes that stream
          // sums them as it goes (sum_dx, below), where both of its folds are on.
          if (kind == "bgrad_a")
            return ownGemm(n, ctx_) && (only.empty() || only.find(",bgrad_a,") != std::string::npos) &&
                   !(residualStreamGradient(n.operand(0)) && foldLayerNormGradBiasSum_ && foldLayerNormGradResidual_);
          if (kind == "bias" && n.numOperands() == 4) kind = "bias_residual";
          if (!only.empty() && only.find(cat(",", kind, ",")) == std::string::npos) return false;
          return dev(r).matmul->supports(n);
        };
      std::function<bool(const Node&)> canSumDx;  // bias gradients summed by the layer_norm_grad kernel
      if (foldLayerNormGradBiasSum_) canSumDx = [this](const Node& n) { return layerNormGradSumsDx(n, ctx_); };
      std::function<bool(const Node&)> canAddResidual;  // the forward residual adds in the layer_norm kernel
      if (foldLayerNormResidual_) canAddResidual = layerNormTakesResidual;
      if (Status s = rewriteForCuda(*ranks_[r].graph, canRun, foldLayerNormGradResidual_, canSumDx, canAddResidual); !s.ok())
        return makeError(rankPrefix(r), s.error());
      // Collectives as early as they can go: what they pass over overlaps them on the communication stream.
      if (commStream_)
        if (auto h = createHoistCollectivesPass()->run(*ranks_[r].graph); !h.ok()) return makeError(rankPrefix(r), h.error());
    }
    // Lower every node of every rank (pure), plan the matmuls, then size the memory.
    std::vector<std::vector<NodeLowering>> lowerings(ranks_.size());
    std::vector<std::vector<int>> matmulPlans(ranks_.size());
    matmulCalls.assign(ranks_.size(), {});
    attentionPlans_.assign(ranks_.size(), {});
    for (size_t r = 0; r < ranks_.size(); ++r) {
      Rank& rk = ranks_[r];
      // The rank's GPU current: cuDNN's plans and cuBLASLt's timed choices are made on it.
      CU_TRY(cudaSetDevice(dev(r).device), "GPU ", dev(r).device);
      auto groups = fusionGroups(*rk.graph);
      if (!groups.ok()) return makeError(rankPrefix(r), groups.error());
      rk.groups = std::move(groups).value();
      for (const FusionGroup& fg : rk.groups)
        for (const Node* m : fg.members) rk.groupOf[m] = &fg;
      // The AdamW updates as multi-tensor kernels, gated on the step's loss and grad_norm (adamw_groups.h).
      std::vector<FusionGroup> adamw;
      if (options_.multiTensorAdamW) adamw = adamwGroups(*rk.graph, &rk.groupOf, multiTensorCasts() && adamwCopies_);
      rk.copies.clear();
      for (const FusionGroup& fg : adamw)
        for (const Value* c : adamwGroupCopies(fg)) rk.copies.insert(c);
      for (FusionGroup& fg : adamw) rk.groups.push_back(std::move(fg));
      auto regroup = [&rk] {
        rk.groupOf.clear();
        for (const FusionGroup& fg : rk.groups) {
          for (const Node* m : fg.members) rk.groupOf[m] = &fg;
          for (const Node* m : fg.absorbed) rk.groupOf[m] = &fg;  // run inside the group's kernel
        }
      };
      regroup();
      // The casts of the parameters (their bf16 copies) as one multi-tensor kernel per pair of dtypes.
      if (multiTensorCasts()) {
        std::vector<FusionGroup> casts = castGroups(*rk.graph, &rk.groupOf);
        for (FusionGroup& fg : casts) rk.groups.push_back(std::move(fg));
        regroup();
      }
      for (Node* n : rk.graph->nodes()) {
        NodeExec how = nodeExec(*n);
        lowerings[r].emplace_back();
        matmulPlans[r].push_back(-1);
        attentionPlans_[r].push_back(-1);
        if (const FusionGroup* fg = rk.groupOf.lookup(n)) {
          if (fg->members.back() != n) continue;  // the group's kernel runs at its last member
          auto l = isAdamWGroup(*fg)  ? lowerAdamWGroup(*fg, ctx_)
                   : isCastGroup(*fg) ? lowerCastGroup(*fg, ctx_, 2048, keptFlags(rk, *fg))
                                      : lowerFusionGroup(*fg, ctx_);
          if (!l.ok()) return makeError(rankPrefix(r), "lowering ", groupName(*fg), ": ", l.error());
          lowerings[r].back() = std::move(l).value();
        } else if (nccl_ && n->has(traits::Collective)) {
          lowerings[r].back().workspaceBytes = ncclStagingBytes(*n);
        } else if (how == NodeExec::Kernels) {
          TPC_ASSIGN(bool byCudnn, planCudnnAttention(r, *n, lowerings[r].back()));
          if (!byCudnn) {
            auto l = lowerNode(*n, ctx_);
            if (!l.ok()) return makeError(rankPrefix(r), "lowering ", n->opName(), " -> ", n->result()->ref(), ": ", l.error());
            lowerings[r].back() = std::move(l).value();
          }
        } else if (how == NodeExec::Matmul && ownGemm(*n, ctx_)) {
          auto l = lowerGemm(*n, ctx_);
          if (!l.ok()) return makeError(rankPrefix(r), "lowering ", n->opName(), " -> ", n->result()->ref(), ": ", l.error());
          lowerings[r].back() = std::move(l).value();
        } else if (how == NodeExec::Matmul) {
          matmulCalls[r].resize(matmulPlans[r].size());
          auto id = dev(r).matmul->plan(*n, &matmulCalls[r].back());
          if (!id.ok()) return makeError(rankPrefix(r), id.error());
          matmulPlans[r].back() = *id;
        }
      }
    }
    borrowState();
    std::vector<StepMemoryPlan> plans(ranks_.size());
    for (size_t r = 0; r < ranks_.size(); ++r)
      TPC_TRY(planRank(r, lowerings[r], plans[r]));
    borrowArenas();
    for (size_t i = 0; i < devs_.size(); ++i) {
      int64_t ws = static_cast<int64_t>(devs_[i].matmul->workspaceBytes()), arenas = 0, stateB = 0, inputB = 0, keptB = 0;
      for (size_t r = 0; r < ranks_.size(); ++r)
        if (&dev(r) == &devs_[i])
          arenas += ranks_[r].arenaBorrowed ? 0 : ranks_[r].arenaBytes, stateB += ranks_[r].stateBytes, inputB += ranks_[r].inputBytes,
              keptB += ranks_[r].keptBytes;
      int64_t needed = ws + arenas + stateB + keptB + inputB;
      size_t freeB = 0, totalB = 0;
      CU_TRY(cudaSetDevice(devs_[i].device), "GPU ", devs_[i].device);
      CU_TRY(cudaMemGetInfo(&freeB, &totalB), "memory info");
      if (options_.verbose)
        std::printf("cuda: memory plan on GPU %d (%s): activations arena %s (planned peak%s), parameters and optimizer "
                    "state %s%s, batch %s, cuBLASLt workspace %s: %s of %s free\n",
                    devs_[i].device, deviceName_.c_str(), mib(arenas).c_str(),
                    !nccl_ && ranks_.size() > 1 ? cat(", ", ranks_.size(), " virtual ranks").c_str() : "",
                    mib(stateB).c_str(), keptB ? cat(" (and ", mib(keptB), " of it kept for non-finite steps)").c_str() : "",
                    mib(inputB).c_str(), mib(ws).c_str(), mib(needed).c_str(),
                    mib(static_cast<int64_t>(freeB)).c_str());
      if (needed > static_cast<int64_t>(freeB) * 97 / 100)
        return makeError("cuda: the training step needs ", mib(needed), " of GPU memory (activations ", mib(arenas),
                         ", parameters and optimizer state ", mib(stateB), keptB ? cat(" and ", mib(keptB), " of it kept") : "",
                         ") but only ", mib(static_cast<int64_t>(freeB)),
                         " are free on GPU ", devs_[i].device, " (", deviceName_,
                         "); use a smaller --micro-batch-size (or recompute) to lower the activations");
    }

    TPC_TRY(compileKernels(lowerings));
    for (size_t r = 0; r < ranks_.size(); ++r) TPC_TRY(allocateRank(r, state, plans[r]));
    TPC_TRY(pinnedLayout());
    if (nccl_) TPC_TRY(createCommunicators());
    for (size_t r = 0; r < ranks_.size(); ++r)
      TPC_TRY(buildLaunches(r, lowerings[r], matmulPlans[r], plans[r]));
    TPC_TRY(assemble());
    auto& st = compiler_->stats();
    if (options_.verbose)
      std::printf("cuda: %lld launches per step%s (%d cuBLASLt matmul shapes); kernels: %d compiled by NVRTC in %.1fs, %d "
                  "from the cache %s; prepared in %.1fs\n",
                  static_cast<long long>(launchCount_), nccl_ ? " per GPU" : "", devs_[0].matmul->distinctShapes(), st.compiled, st.seconds, st.cacheHits,
                  compiler_->cacheDir().c_str(),
                  std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    if (options_.verbose && devs_[0].attention && devs_[0].attention->plans() > 0)
      std::printf("cuda: attention through %s fused flash attention (%d plans)\n", devs_[0].attention->version().c_str(),
                  devs_[0].attention->plans());
    debug_ = std::getenv("TPC_CUDA_DEBUG") != nullptr;
    if (!debug_) TPC_TRY(capture());
    if (options_.verbose && !debug_ && commStream_) {
      const CommSchedule& cs = devs_[0].schedule;
      std::printf("cuda: %zu collectives%s on a communication stream: %lld forks, %lld joins, %lld launches overlap them\n",
                  cs.collectives.size(), nccl_ ? " per GPU" : "", static_cast<long long>(cs.forks),
                  static_cast<long long>(cs.joins), static_cast<long long>(cs.overlapped));
    }
    prepared_ = true;
    return {};
  }

  Result<TensorMap> step(const TensorMap& inputs, int64_t stepIndex) override {
    TPC_TRY(startStep(inputs, stepIndex));
    return finishStep();
  }

  // Per GPU: the batch in, the step and hold words, then the replay (or the debug or profiled launches);
  // returns once every GPU has it queued.
  Status startStep(const TensorMap& inputs, int64_t stepIndex) override {
    if (!prepared_) return makeError("cuda backend: step() before a successful prepare()");
    if (started_) return makeError("cuda backend: startStep() twice without finishStep()");
    TPC_TRY(checkBorrowedArenas());
    const auto t0 = std::chrono::steady_clock::now();
    // The host copies stay alive until finishStep(): the copies from them may still be in flight.
    TPC_ASSIGN(pendingCopies_, rankInputs(inputs));
    pendingStep_ = stepIndex;
    std::vector<std::string> errors(devs_.size());
    auto launchOn = [&](size_t i) {
      DeviceCtx& d = devs_[i];
      auto fail = [&](const std::string& e) { errors[i] = e; };
      if (cudaSetDevice(d.device) != cudaSuccess) return fail(cat("cuda: cannot use GPU ", d.device));
      d.stepReplayed = false;
      if (Status s = stageStep(d, pendingCopies_, stepIndex); !s.ok()) return fail(s.error());
      bool profiling = !debug_ && options_.profileStep == stepIndex;
      if (debug_) {
        Status st = enqueueAll(d, true, stepIndex);
        if (!st.ok()) return fail(st.error());
      } else if (profiling) {
        Status st = launchProfiled(d, stepIndex);
        if (!st.ok()) return fail(st.error());
      } else {
        d.replayTimed = cudaEventRecord(d.replayStart, d.stream) == cudaSuccess;
        if (cudaError_t e = cudaGraphLaunch(d.exec, d.stream); e != cudaSuccess)
          return fail(cat("cuda: step ", stepIndex, ": launching the step graph: ", cudaGetErrorString(e)));
        d.replayTimed = d.replayTimed && cudaEventRecord(d.replayEnd, d.stream) == cudaSuccess;
        d.stepReplayed = d.replayTimed;
      }
      if (&d == &dev(0))
        if (Status st = queueOutputs(d); !st.ok()) return fail(st.error());
    };
    onEveryDevice(launchOn);
    for (const std::string& e : errors)
      if (!e.empty()) {
        if (nccl_) abortCommunicators();
        pendingCopies_.clear();
        return Error{e};
      }
    started_ = true;
    copiesFresh_ = true;  // the step's cast groups wrote the copies if they were stale; its AdamW kernels keep them
    timing_ = StepTiming{};
    timing_.startMs = msSince(t0);
    return {};
  }

  // Waits for the step startStep() queued (bounded by the collective timeout) and reads its outputs back.
  Result<TensorMap> finishStep() override {
    if (!started_) return makeError("cuda backend: finishStep() without startStep()");
    started_ = false;
    const int64_t stepIndex = pendingStep_;
    const auto t0 = std::chrono::steady_clock::now();
    std::vector<std::string> errors(devs_.size());
    auto waitOn = [&](size_t i) {
      DeviceCtx& d = devs_[i];
      auto fail = [&](const std::string& e) { errors[i] = e; };
      if (cudaSetDevice(d.device) != cudaSuccess) return fail(cat("cuda: cannot use GPU ", d.device));
      auto start = std::chrono::steady_clock::now();
      for (;;) {
        cudaError_t e = cudaStreamQuery(d.stream);
        if (e == cudaSuccess) break;
        if (e != cudaErrorNotReady)
          return fail(cat("cuda: step ", stepIndex, " failed on GPU ", d.device, ": ", cudaGetErrorString(e),
                          " (run with TPC_CUDA_DEBUG=1 to find the kernel)"));
        double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        if (nccl_ && waited > options_.collectiveTimeoutSeconds) {
          std::string rank = cat("rank ", meshRank(i));
          return fail(cat(rank, " (GPU ", d.device, "): step ", stepIndex, " did not finish within --collective-timeout ",
                          options_.collectiveTimeoutSeconds, "s: a collective is stuck (", collectiveSummary(i), ")"));
        }
        // Sleep while the step is far from done, then poll without sleeping: a sleep overshoots by tens of
        // microseconds, all of them idle device time between two steps. The last wait says when it ends.
        if (waited < d.lastWaitS - 5e-4 || waited > d.lastWaitS + 2e-3)
          std::this_thread::sleep_for(std::chrono::microseconds(50));
      }
      d.lastWaitS = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    };
    onEveryDevice(waitOn);
    pendingCopies_.clear();
    for (size_t i = 0; i < errors.size(); ++i)
      if (!errors[i].empty()) {
        if (nccl_) abortCommunicators();
        return Error{errors[i]};
      }
    const auto t1 = std::chrono::steady_clock::now();
    timing_.waitMs = msSince(t0);
    if (!debug_ && options_.profileStep == stepIndex) TPC_TRY(printProfile(stepIndex));
    CU_TRY(cudaSetDevice(dev(0).device), "GPU ", dev(0).device);
    float replayMs = 0;
    if (dev(0).stepReplayed && cudaEventElapsedTime(&replayMs, dev(0).replayStart, dev(0).replayEnd) == cudaSuccess)
      timing_.deviceMs = replayMs;
    // Outputs that do not update a parameter, from rank 0 (queueOutputs() copied them behind the step).
    TensorMap result;
    for (const Rank::Out& o : ranks_[0].outs) {
      HostTensor t(o.value->type());
      std::memcpy(t.raw(), static_cast<const char*>(dev(0).pinned) + o.offset, t.bytes());
      result[o.name] = isFloat(t.dtype()) && t.dtype() != DType::f32 ? t.convertTo(DType::f32) : t;
    }
    // A non-finite step: the AdamW kernels left the state alone; what ungated nodes updated comes back.
    if (isNonFiniteStep(result)) TPC_TRY(restoreState());
    timing_.readMs = msSince(t1);
    lastTiming_ = timing_;
    return result;
  }

  std::optional<StepTiming> lastStepTiming() const override { return lastTiming_; }

  // Re-runs the step launch by launch from the current state, checking every input, parameter and node
  // result of every rank on the device as soon as it is complete; the earliest node position wins, then
  // the lowest rank (as the CPU backends). The hold word keeps the AdamW kernels off the state; what
  // ungated nodes update is given back afterwards.
  Result<std::optional<NonFiniteValue>> findFirstNonFinite(const TensorMap& inputs, int64_t stepIndex) override {
    if (!prepared_) return makeError("cuda backend: findFirstNonFinite() before a successful prepare()");
    TPC_ASSIGN(auto copies, rankInputs(inputs));
    const size_t R = ranks_.size();
    std::vector<std::optional<NonFiniteValue>> found(R);
    std::vector<std::string> errors(devs_.size());
    // Rank r's value v (node index k, -1 for an input or parameter), unless r already has an earlier one.
    auto check = [&](size_t r, const Value* v, int64_t k, const char* what) -> Status {
      if (found[r] && found[r]->index <= k) return {};
      TPC_ASSIGN(auto bad, firstNonFiniteOnDevice(*v, ranks_[r].addr.lookup(v)));
      if (!bad) return {};
      const Graph& g = *ranks_[r].graph;
      ValueNames names(g);
      NonFiniteValue nf;
      nf.value = names(v);
      nf.node = k < 0 ? std::string(what) : printNode(*v->def(), names);
      nf.index = k;
      nf.numNodes = static_cast<int64_t>(g.numNodes());
      nf.rank = meshRanks() > 1 ? meshRank(r) : -1;
      nf.element = bad->element;
      nf.sample = bad->sample;
      found[r] = std::move(nf);
      return {};
    };
    auto runDevice = [&](size_t i) {
      DeviceCtx& d = devs_[i];
      Status st = [&]() -> Status {
        CU_TRY(cudaSetDevice(d.device), "GPU ", d.device);
        TPC_TRY(stageStep(d, copies, stepIndex, true));
        CU_TRY(cudaStreamSynchronize(d.stream), "checking mode: staging the step");
        for (size_t r = 0; r < R; ++r) {
          if (&dev(r) != &d) continue;
          for (Value* v : ranks_[r].graph->inputs()) TPC_TRY(check(r, v, -1, "input"));
          for (Value* v : ranks_[r].graph->params()) TPC_TRY(check(r, v, -1, "param"));
        }
        std::vector<std::vector<Node*>> nodes(R);
        for (size_t r = 0; r < R; ++r) nodes[r] = ranks_[r].graph->nodeVector();
        for (const Launch& l : d.launches) {
          TPC_TRY(enqueue(d, l));
          if (l.checks.empty()) continue;
          CU_TRY(cudaStreamSynchronize(d.stream), "checking mode: ", l.what);
          for (const auto& [r, k] : l.checks) {
            const Node* n = nodes[r][static_cast<size_t>(k)];
            const FusionGroup* fg = ranks_[r].groupOf.lookup(n);
            for (const Value* v : n->results())
              if (!fg || !fg->isInternal(v) || ranks_[r].addr.count(v)) TPC_TRY(check(r, v, k, nullptr));
          }
        }
        return {};
      }();
      if (!st.ok()) errors[i] = st.error();
    };
    onEveryDevice(runDevice);
    for (const std::string& e : errors)
      if (!e.empty()) {
        if (nccl_) abortCommunicators();
        return Error{e};
      }
    TPC_TRY(restoreState());
    std::optional<NonFiniteValue> first;
    for (auto& f : found)
      if (f && (!first || f->index < first->index)) first = std::move(f);
    if (processMode()) return firstNonFiniteOfJob(first, meshRanks(), options_.allGatherWorld);
    return first;
  }

  Result<HostTensor> readState(const std::string& name) const override {
    if (ranks_.empty() || !ranks_[0].params.count(name)) return makeError("cuda backend: no state tensor named '", name, "'");
    const Mesh& mesh = ranks_[0].graph->mesh();
    auto fetch = [&](size_t r) -> Result<HostTensor> {
      auto [p, buf] = ranks_[r].params.at(name);
      HostTensor t(p->type());
      CU_TRY(cudaSetDevice(dev(r).device), "GPU ", dev(r).device);
      CU_TRY(cudaMemcpy(t.raw(), buf, t.bytes(), cudaMemcpyDeviceToHost), "reading %", name);
      return isFloat(t.dtype()) && t.dtype() != DType::f32 ? t.convertTo(DType::f32) : t;
    };
    if (mesh.empty()) return fetch(0);
    TPC_ASSIGN(HostTensor l0, fetch(0));
    const Value* p0 = ranks_[0].params.at(name).first;
    TPC_ASSIGN(Shape gshape, globalShape(l0.shape(), p0->placement(), mesh));
    HostTensor global(TensorType(l0.dtype(), gshape));
    if (processMode()) {  // every rank's block from its process; the ranks share one program, so one placement
      TPC_ASSIGN(std::vector<HostTensor> blocks, gatherRankBlocks(l0, mesh.numRanks(), options_.allGatherWorld));
      for (size_t q = 0; q < blocks.size(); ++q)
        TPC_TRY(placeIntoGlobal(blocks[q], p0->placement(), mesh, static_cast<int64_t>(q), global));
      return global;
    }
    for (size_t r = 0; r < ranks_.size(); ++r) {
      TPC_ASSIGN(HostTensor l, fetch(r));
      TPC_TRY(placeIntoGlobal(l, ranks_[r].params.at(name).first->placement(), mesh, static_cast<int64_t>(r), global));
    }
    return global;
  }

  // Each rank's slice of `value`, uploaded into that rank's buffer (as prepare() does with the initial state).
  Status writeState(const std::string& name, const HostTensor& value) override {
    if (!prepared_ || !ranks_[0].params.count(name)) return makeError("cuda backend: no state tensor named '", name, "'");
    TPC_TRY(refuseBorrowed(name, nullptr));
    copiesFresh_ = false;
    const Mesh& mesh = ranks_[0].graph->mesh();
    for (size_t r = 0; r < ranks_.size(); ++r) {
      auto [p, buf] = ranks_[r].params.at(name);
      HostTensor t = value;
      if (!mesh.empty()) {
        auto local = sliceForRank(t, p->placement(), mesh, meshRank(r));
        if (!local.ok()) return makeError("cuda backend: state tensor '", name, "': ", local.error());
        t = std::move(local).value();
      }
      // Same elements, maybe another shape of them (tp views QKV as [D, 3, D]).
      if (t.numel() != p->type().numel())
        return makeError("cuda backend: state tensor '", name, "' is ", p->type().str(), ", cannot take ", t.type().str());
      if (t.dtype() != p->dtype()) t = t.convertTo(p->dtype());
      CU_TRY(cudaSetDevice(dev(r).device), "GPU ", dev(r).device);
      CU_TRY(cudaMemcpy(buf, t.raw(), t.bytes(), cudaMemcpyHostToDevice), "writing %", name);
      // From pageable memory the copy may still be in flight on return; our replay runs on another stream.
      CU_TRY(cudaDeviceSynchronize(), "writing %", name);
    }
    return {};
  }

  std::optional<DeviceTensor> deviceState(const std::string& name, int64_t rank = 0) const override {
    if (!prepared_) return std::nullopt;
    for (size_t r = 0; r < ranks_.size(); ++r) {
      if (meshRank(r) != rank || !ranks_[r].params.count(name)) continue;
      auto [p, buf] = ranks_[r].params.at(name);
      return DeviceTensor{dev(r).device, buf, p->type(), blockLayout(*p)};
    }
    return std::nullopt;
  }

  // Nothing for a parameter read in the source's own buffers (CudaOptions::stateSource, borrowState). Else
  // device to device, rank by rank, when the source holds every one of our ranks' blocks on the same GPU,
  // in our dtype and layout (the same mesh and placement: an evaluator sharded as the training is, or both
  // unsharded); through the host otherwise. The source's step() has finished (it waits for its replay), and
  // the copies are on our streams, ahead of our next replay. Under mpirun every process decides alike (the
  // processes run one program), so none waits alone in the host path's gather.
  Status copyStateFrom(const Backend& source, const std::string& name) override {
    if (!prepared_ || !ranks_[0].params.count(name)) return Backend::copyStateFrom(source, name);
    TPC_TRY(refuseBorrowed(name, &source));
    if (ranks_[0].borrowed.count(name)) {  // the source's own buffers (every rank's): nothing to copy, if still theirs
      for (size_t r = 0; r < ranks_.size(); ++r) {
        auto [p, buf] = ranks_[r].params.at(name);
        if (sourceBlock(source, r, *p) != buf)
          return makeError("cuda backend: ", rankPrefix(r), "parameter '", name, "' was read from ", source.name(),
                           "'s memory, which no longer holds it (was that backend prepared again?)");
      }
      return {};
    }
    copiesFresh_ = false;
    std::vector<const void*> from;
    for (size_t r = 0; r < ranks_.size(); ++r) {
      const void* f = sourceBlock(source, r, *ranks_[r].params.at(name).first);
      if (!f) return Backend::copyStateFrom(source, name);
      from.push_back(f);
    }
    for (size_t r = 0; r < ranks_.size(); ++r) {
      auto [p, buf] = ranks_[r].params.at(name);
      CU_TRY(cudaSetDevice(dev(r).device), "GPU ", dev(r).device);
      CU_TRY(cudaMemcpyAsync(buf, from[r], static_cast<size_t>(p->type().bytes()), cudaMemcpyDeviceToDevice, dev(r).stream),
             rankPrefix(r), "copying %", name, " from ", source.name());
    }
    return {};
  }

 private:
  // CudaOptions::multiTensorCasts, unless TPC_MULTI_TENSOR_CASTS (0 or 1) says otherwise.
  bool multiTensorCasts() const {
    const char* e = std::getenv("TPC_MULTI_TENSOR_CASTS");
    return e && *e ? std::string(e) != "0" : options_.multiTensorCasts;
  }

  // Which tensors of cast group fg have a copy the AdamW kernels keep (lowerCastGroup).
  static std::vector<bool> keptFlags(const Rank& rk, const FusionGroup& fg) {
    std::vector<bool> kept;
    for (const Value* v : fg.outputs) kept.push_back(rk.copies.contains(v));
    return kept;
  }

  static std::string groupName(const FusionGroup& fg) {
    if (isAdamWGroup(fg)) return cat("adamw_update x", fg.members.size(), " (one multi-tensor kernel)");
    if (isCastGroup(fg)) return cat("cast x", fg.inputs.size(), " (one multi-tensor kernel)");
    std::string s = cat("fusion_group=", fg.id, " (");
    for (size_t k = 0; k < fg.members.size(); ++k) s += cat(k ? " " : "", fg.members[k]->opName());
    return s + ")";
  }

  // fn(i) for every GPU: inline with one, a thread per GPU with several (NCCL wants each rank's calls on a
  // thread of its own, all at once).
  template <typename F>
  void onEveryDevice(F& fn) {
    if (devs_.size() == 1) return fn(size_t{0});
    std::vector<std::thread> threads;
    for (size_t i = 0; i < devs_.size(); ++i) threads.emplace_back(std::ref(fn), i);
    for (auto& t : threads) t.join();
  }

  std::string rankPrefix(size_t r) const { return meshRanks() > 1 ? cat("rank ", meshRank(r), ": ") : ""; }
  // Which block of a state tensor a rank holds (deviceState): the mesh and its placement; "" unsharded.
  std::string blockLayout(const Value& p) const {
    const Mesh& mesh = ranks_[0].graph->mesh();
    if (mesh.empty()) return "";
    return mesh.str() + " " + (p.placement() ? p.placement()->str() : std::string("R"));
  }
  // The rank of CudaOptions::stateSource, a prepared CUDA backend, that is mesh rank meshRank(r) on r's GPU;
  // nullptr where there is none.
  const Rank* sourceRank(size_t r) const {
    const auto* src = dynamic_cast<const CudaBackend*>(options_.stateSource);
    if (!src || src == this || !src->prepared_) return nullptr;
    for (size_t q = 0; q < src->ranks_.size(); ++q)
      if (src->meshRank(q) == meshRank(r) && src->dev(q).device == dev(r).device) return &src->ranks_[q];
    return nullptr;
  }

  // Our activations arena in CudaOptions::stateSource's, where its same rank's is at least as large: a step's
  // values live within the step (memory_plan.h), so between the source's steps its arena holds nothing, and
  // ours (an evaluation's forward) can use it. The two backends must then never run at once (stateSource).
  void borrowArenas() {
    for (size_t r = 0; r < ranks_.size(); ++r) {
      const Rank* s = sourceRank(r);
      if (!s || !s->arena || s->arenaBytes < ranks_[r].arenaBytes) continue;
      ranks_[r].arena = s->arena;
      ranks_[r].arenaBorrowed = true;
    }
  }

  // Before each step: what we borrow from CudaOptions::stateSource must still be there (the parameters are
  // checked in copyStateFrom as well, which the evaluator calls first).
  Status checkBorrowedArenas() const {
    for (size_t r = 0; r < ranks_.size(); ++r) {
      if (!ranks_[r].arenaBorrowed) continue;
      const Rank* s = sourceRank(r);
      if (!s || s->arena != ranks_[r].arena || s->arenaBytes < ranks_[r].arenaBytes)
        return makeError("cuda backend: ", rankPrefix(r), "the activations arena borrowed from ", options_.stateSource->name(),
                         " is no longer there (was that backend prepared again or released?)");
    }
    return {};
  }

  // A parameter read from CudaOptions::stateSource's buffers takes no value but the source's own (`from`):
  // writing it would write the source's state. OK when it is not borrowed (borrowState: all ranks or none).
  Status refuseBorrowed(const std::string& name, const Backend* from) const {
    if (!ranks_[0].borrowed.count(name) || from == options_.stateSource) return {};
    return makeError("cuda backend: parameter '", name, "' is read from ", options_.stateSource->name(),
                     "'s memory (CudaOptions::stateSource) and cannot be written here");
  }

  // `source`'s buffer of rank r's block of `p`, where it matches ours: on r's GPU, in p's dtype and layout;
  // nullptr otherwise.
  const void* sourceBlock(const Backend& source, size_t r, const Value& p) const {
    auto f = source.deviceState(p.name(), meshRank(r));
    if (!f || f->device != dev(r).device || f->type.dtype != p.dtype() || f->type.numel() != p.type().numel() ||
        f->layout != blockLayout(p))
      return nullptr;
    return f->data;
  }

  // The parameters this backend reads in CudaOptions::stateSource's buffers instead of its own (Rank::borrowed):
  // those no output of the step replaces (nothing of ours writes them) whose every rank's block the source holds
  // as we would. All ranks or none, so that a parameter is either the source's alone or copied as a whole.
  void borrowState() {
    if (!options_.stateSource || options_.stateSource == this) return;
    std::set<std::string> replaced;
    for (size_t i = 0; i < ranks_[0].graph->outputs().size(); ++i) replaced.insert(ranks_[0].graph->outputName(i));
    for (size_t k = 0; k < ranks_[0].graph->params().size(); ++k) {
      const std::string& name = ranks_[0].graph->params()[k]->name();
      if (replaced.count(name)) continue;
      std::vector<const void*> blocks;
      for (size_t r = 0; r < ranks_.size(); ++r) {
        const Value* p = ranks_[r].graph->params()[k];
        if (const void* b = p->name() == name ? sourceBlock(*options_.stateSource, r, *p) : nullptr) blocks.push_back(b);
      }
      if (blocks.size() != ranks_.size()) continue;
      for (size_t r = 0; r < ranks_.size(); ++r) {
        ranks_[r].params[name] = {ranks_[r].graph->params()[k], const_cast<void*>(blocks[r])};
        ranks_[r].borrowed.insert(name);
      }
    }
  }

  // One process per mesh rank (CudaOptions::processRank): ranks_ holds this process's rank alone.
  bool processMode() const { return options_.processRank >= 0; }
  // The mesh rank of ranks_[r], and how many the mesh has (1 without a mesh).
  int64_t meshRank(size_t r) const { return processMode() ? options_.processRank : static_cast<int64_t>(r); }
  int64_t meshRanks() const {
    if (processMode() && !ranks_.empty()) return ranks_[0].graph->mesh().numRanks();
    return static_cast<int64_t>(std::max<size_t>(ranks_.size(), 1));
  }
  DeviceCtx& dev(size_t r) { return devs_[nccl_ ? r : 0]; }
  const DeviceCtx& dev(size_t r) const { return devs_[nccl_ ? r : 0]; }

  // Whether cuDNN runs node n of rank r (an attention op it takes): its plan goes to attentionPlans_ and its
  // workspace size to `l`. false: our kernels run it (no cuDNN, or, under "auto", cuDNN refused the shape: the
  // reason printed once); under TPC_ATTENTION=cudnn a refusal is an error.
  Result<bool> planCudnnAttention(size_t r, const Node& n, NodeLowering& l) {
    if (!dev(r).attention || !cudnnAttentionTakes(n)) return false;
    auto id = dev(r).attention->plan(n);
    if (id.ok()) {
      attentionPlans_[r].back() = *id;
      l.workspaceBytes = dev(r).attention->workspaceBytes(*id);
      return true;
    }
    if (attentionMode_ == "cudnn") return makeError(rankPrefix(r), "TPC_ATTENTION=cudnn: ", id.error());
    if (options_.verbose && attentionFallbacks_.insert(id.error()).second)  // a model's layers share their shapes
      std::printf("cuda: %s through tpc's kernels: %s\n", n.opName().data(), id.error().c_str());
    return false;
  }

  using RankCopies = std::vector<std::vector<std::pair<void*, HostTensor>>>;

  // Rank r's block of the unsharded `t` for graph value `v` (an input or a parameter: `what`), checked against
  // v's local shape and converted to its dtype.
  Result<HostTensor> rankBlock(HostTensor t, const Value& v, size_t r, const char* what) const {
    const Mesh& mesh = ranks_[0].graph->mesh();
    if (!mesh.empty()) {
      auto local = sliceForRank(t, v.placement(), mesh, meshRank(r));
      if (!local.ok()) return makeError("cuda backend: ", what, " %", v.name(), ": ", local.error());
      t = std::move(local).value();
    }
    if (t.shape() != v.shape())
      return makeError("cuda backend: ", what, " %", v.name(), " must be ", v.type().str(), ", got ", t.type().str());
    if (t.dtype() != v.dtype()) t = t.convertTo(v.dtype());
    return t;
  }

  // Each rank's inputs, sliced and converted on the host, with the device buffer each goes to.
  Result<RankCopies> rankInputs(const TensorMap& inputs) {
    RankCopies copies(ranks_.size());
    for (size_t r = 0; r < ranks_.size(); ++r) {
      for (Value* v : ranks_[r].graph->inputs()) {
        auto it = inputs.find(v->name());
        if (it == inputs.end()) return makeError("cuda backend: missing input %", v->name(), " (", v->type().str(), ")");
        TPC_ASSIGN(HostTensor t, rankBlock(it->second, *v, r, "input"));
        copies[r].push_back({ranks_[r].addr[v], t});
      }
    }
    return copies;
  }

  // Each device's pinned block (DeviceCtx::pinned): its ranks' graph inputs, the step and hold words, and on
  // rank 0's device the outputs finishStep() returns, each at a 64-byte boundary.
  Status pinnedLayout() {
    std::vector<size_t> used(devs_.size(), 0);
    auto place = [](size_t& at, int64_t bytes) {
      size_t o = at;
      at += (static_cast<size_t>(bytes) + 63) / 64 * 64;
      return o;
    };
    for (size_t r = 0; r < ranks_.size(); ++r) {
      Rank& rk = ranks_[r];
      size_t& at = used[static_cast<size_t>(&dev(r) - devs_.data())];
      rk.inputOffset.clear();
      for (Value* v : rk.graph->inputs()) rk.inputOffset.push_back(place(at, v->type().bytes()));
    }
    Rank& r0 = ranks_[0];
    const Graph& g0 = *r0.graph;
    r0.outs.clear();
    for (size_t i = 0; i < g0.outputs().size(); ++i) {
      std::string name = g0.outputName(i);
      if (r0.params.count(name)) continue;
      const Value* v = g0.outputs()[i].value;
      auto a = r0.addr.find(v);
      if (a == r0.addr.end() || !a->second) return makeError("cuda backend: output %", name, " has no device buffer");
      r0.outs.push_back({name, v, place(used[0], v->type().bytes())});
    }
    for (size_t i = 0; i < devs_.size(); ++i) {
      DeviceCtx& d = devs_[i];
      d.stepOffset = place(used[i], sizeof(int64_t));
      d.holdOffset = place(used[i], sizeof(int32_t));
      d.freshOffset = place(used[i], sizeof(int32_t));
      CU_TRY(cudaSetDevice(d.device), "GPU ", d.device);
      CU_TRY(cudaHostAlloc(&d.pinned, used[i], cudaHostAllocPortable), "page-locked host memory for the step's transfers (",
             used[i], " bytes)");
    }
    return {};
  }

  // On d's stream (its device current): keep a copy of the parameters its ranks' ungated nodes update (a
  // non-finite step gets them back), then the batch, the step word and the hold word (`hold`: checking mode),
  // through d's pinned block: the previous step has finished with it (finishStep() waited for it).
  Status stageStep(DeviceCtx& d, RankCopies& copies, int64_t stepIndex, bool hold = false) {
    char* pinned = static_cast<char*>(d.pinned);
    for (size_t r = 0; r < ranks_.size(); ++r) {
      if (&dev(r) != &d) continue;
      Rank& rk = ranks_[r];
      for (const Rank::Kept& k : rk.keptParams)
        CU_TRY(cudaMemcpyAsync(static_cast<char*>(rk.kept) + k.offset, rk.params[k.name].second, static_cast<size_t>(k.bytes),
                               cudaMemcpyDeviceToDevice, d.stream),
               "keeping %", k.name, " of step ", stepIndex, " on GPU ", d.device);
      for (size_t k = 0; k < copies[r].size(); ++k) {
        auto& [ptr, t] = copies[r][k];
        char* slot = pinned + rk.inputOffset[k];
        std::memcpy(slot, t.raw(), t.bytes());
        CU_TRY(cudaMemcpyAsync(ptr, slot, t.bytes(), cudaMemcpyHostToDevice, d.stream), "copying the batch to GPU ", d.device);
      }
    }
    const int64_t step = stepIndex;
    const int32_t holdWord = hold ? 1 : 0;
    std::memcpy(pinned + d.stepOffset, &step, sizeof step);
    std::memcpy(pinned + d.holdOffset, &holdWord, sizeof holdWord);
    const int32_t fresh = copiesFresh_ ? 1 : 0;
    std::memcpy(pinned + d.freshOffset, &fresh, sizeof fresh);
    CU_TRY(cudaMemcpyAsync(d.freshWord, pinned + d.freshOffset, sizeof fresh, cudaMemcpyHostToDevice, d.stream), "fresh word");
    CU_TRY(cudaMemcpyAsync(d.stepWord, pinned + d.stepOffset, sizeof step, cudaMemcpyHostToDevice, d.stream), "step word");
    CU_TRY(cudaMemcpyAsync(d.holdWord, pinned + d.holdOffset, sizeof holdWord, cudaMemcpyHostToDevice, d.stream), "hold word");
    return {};
  }

  // On rank 0's device, right behind the step: its outputs into the pinned block, for finishStep().
  Status queueOutputs(DeviceCtx& d) {
    char* pinned = static_cast<char*>(d.pinned);
    for (const Rank::Out& o : ranks_[0].outs)
      CU_TRY(cudaMemcpyAsync(pinned + o.offset, ranks_[0].addr.lookup(o.value), static_cast<size_t>(o.value->type().bytes()),
                             cudaMemcpyDeviceToHost, d.stream),
             "reading output %", o.name);
    return {};
  }

  // The parameters ungated nodes update, as they were before the last step (the copies stageStep kept).
  Status restoreState() {
    copiesFresh_ = false;
    for (size_t r = 0; r < ranks_.size(); ++r) {
      Rank& rk = ranks_[r];
      if (rk.keptParams.empty()) continue;
      DeviceCtx& d = dev(r);
      CU_TRY(cudaSetDevice(d.device), "GPU ", d.device);
      // On the step's stream (non-blocking: the legacy default stream would not order against it), and
      // finished before the next step stages its own copy.
      for (const Rank::Kept& k : rk.keptParams)
        CU_TRY(cudaMemcpyAsync(rk.params[k.name].second, static_cast<char*>(rk.kept) + k.offset, static_cast<size_t>(k.bytes),
                               cudaMemcpyDeviceToDevice, d.stream),
               rankPrefix(r), "giving back %", k.name, " kept before a non-finite step");
      CU_TRY(cudaStreamSynchronize(d.stream), rankPrefix(r), "giving back the state kept before a non-finite step");
    }
    return {};
  }

  // NCCL gathers and scatters whole rank-major blocks; along another dim than the first (with something
  // before it) the data goes through a staging buffer, [G, local...], in the node's workspace.
  static bool needsStaging(const Node& n) {
    if (n.op() == OpKind::AllReduce) return false;
    const Value* full = n.op() == OpKind::AllGather ? n.result() : n.operand(0);
    int64_t d = n.getInt("dim");
    if (d < 0) d += full->type().rank();
    int64_t before = 1;
    for (int64_t k = 0; k < d; ++k) before *= full->shape()[k];
    return before > 1;
  }
  static int64_t ncclStagingBytes(const Node& n) {
    if (!needsStaging(n)) return 0;
    return n.op() == OpKind::AllGather ? n.result()->type().bytes() : n.operand(0)->type().bytes();
  }

  std::string collectiveSummary(size_t r) const {
    std::map<std::string, int> count;
    for (Node* n : ranks_[r].graph->nodes())
      if (n->has(traits::Collective)) ++count[cat(n->opName(), " over ", n->getStr("axis"))];
    std::string s;
    for (auto& [k, c] : count) s += cat(s.empty() ? "" : ", ", c, " x ", k);
    return "the step's collectives: " + (s.empty() ? std::string("none") : s);
  }

  // One communicator per group of every mesh axis a collective uses (ncclCommInitAll over the group's GPUs).
  Status createCommunicators() {
    const Mesh& mesh = ranks_[0].graph->mesh();
    std::set<std::string> axes;
    for (Node* n : ranks_[0].graph->nodes())
      if (n->has(traits::Collective)) axes.insert(n->getStr("axis"));
    comms_.assign(ranks_.size(), {});
    if (processMode()) return createProcessCommunicators(mesh, axes);
    for (const std::string& axis : axes) {
      int ai = mesh.axisIndex(axis);
      int64_t G = ai < 0 ? 1 : mesh.axes[ai].size, stride = 1;
      if (ai >= 0)
        for (size_t a = mesh.axes.size(); a-- > static_cast<size_t>(ai) + 1;) stride *= mesh.axes[a].size;
      for (size_t r = 0; r < ranks_.size(); ++r) {
        if ((static_cast<int64_t>(r) / stride) % G != 0) continue;
        std::vector<int> devices;
        std::vector<size_t> members;
        for (int64_t q = 0; q < G; ++q) {
          members.push_back(r + q * stride);
          devices.push_back(dev(members.back()).device);
        }
        std::vector<ncclComm_t> c(G);
        if (ncclResult_t e = ncclLib_->commInitAll(c.data(), static_cast<int>(G), devices.data()); e != ncclSuccess)
          return makeError("NCCL: creating the communicator of ranks ", members.front(), "..", members.back(), " over axis ",
                           axis, " failed: ", ncclLib_->getErrorString(e));
        for (int64_t q = 0; q < G; ++q) {
          comms_[members[q]][axis] = c[q];
          allComms_.push_back(c[q]);
        }
      }
    }
    return {};
  }

  // One process per rank: for every mesh axis the lowest rank of each group draws an NCCL id, and one
  // all-gather over the job's processes (a slot per mesh axis, and the axes this rank's collectives use, which
  // must be the same everywhere) gives each process its group leaders' ids; then ncclCommInitRank axis by
  // axis, in the same (name) order in every process.
  Status createProcessCommunicators(const Mesh& mesh, const std::set<std::string>& axes) {
    const int64_t me = options_.processRank, A = static_cast<int64_t>(mesh.axes.size()), N = mesh.numRanks();
    const std::vector<int64_t> coords = cpu::meshCoords(mesh, me);
    // Each process's contribution: the mesh axes its collectives use (a bit each: every process must join the
    // same communicators, or ncclCommInitRank would wait forever), then an id slot per mesh axis.
    auto slot = [](int64_t a) { return sizeof(uint64_t) + static_cast<size_t>(a) * sizeof(ncclUniqueId); };
    const size_t each = slot(A);
    std::vector<char> mine(each, 0), all(each * static_cast<size_t>(N));
    auto axesOf = [&](const char* c) { uint64_t m; std::memcpy(&m, c, sizeof m); return m; };
    auto idOf = [&](const char* c, int64_t a) {
      ncclUniqueId id;
      std::memcpy(&id, c + slot(a), sizeof id);
      return id;
    };
    uint64_t used = 0;
    for (int64_t a = 0; a < A && a < 64; ++a)
      if (axes.count(mesh.axes[a].name)) used |= uint64_t(1) << a;
    std::memcpy(mine.data(), &used, sizeof used);
    for (int64_t a = 0; a < A; ++a)
      if (coords[a] == 0 && mesh.axes[a].size > 1 && axes.count(mesh.axes[a].name)) {
        ncclUniqueId id;
        if (ncclResult_t e = ncclLib_->getUniqueId(&id); e != ncclSuccess)
          return makeError("NCCL: rank ", me, " drawing the id of its group over axis ", mesh.axes[a].name,
                           " failed: ", ncclLib_->getErrorString(e));
        std::memcpy(mine.data() + slot(a), &id, sizeof id);
      }
    TPC_TRY(options_.allGatherWorld(mine.data(), static_cast<int64_t>(each), all.data()));
    auto names = [&](uint64_t m) {
      std::string n;
      for (int64_t a = 0; a < A && a < 64; ++a)
        if (m >> a & 1) n += (n.empty() ? "" : ",") + mesh.axes[a].name;
      return n.empty() ? std::string("none") : n;
    };
    for (int64_t q = 0; q < N; ++q)
      if (uint64_t theirs = axesOf(all.data() + static_cast<size_t>(q) * each); theirs != used)
        return makeError("cuda backend: the collectives of rank ", me, " run over mesh axes ", names(used), ", those of rank ",
                         q, " over ", names(theirs), ": the ranks' programs disagree (a partitioning bug)");
    CU_TRY(cudaSetDevice(dev(0).device), "GPU ", dev(0).device);
    for (const std::string& axis : axes) {  // the same order in every process: ncclCommInitRank waits for the group
      const int a = mesh.axisIndex(axis);
      const int64_t G = a < 0 ? 1 : mesh.axes[a].size, pos = a < 0 ? 0 : coords[a];
      std::vector<int64_t> leaderCoords = coords;
      if (a >= 0) leaderCoords[a] = 0;
      const int64_t leader = cpu::meshRank(mesh, leaderCoords);
      ncclUniqueId id{};
      if (G > 1) id = idOf(all.data() + static_cast<size_t>(leader) * each, a);
      else if (ncclLib_->getUniqueId(&id) != ncclSuccess) return makeError("NCCL: rank ", me, " drawing an id failed");
      ncclComm_t c = nullptr;
      if (ncclResult_t e = ncclLib_->commInitRank(&c, static_cast<int>(G), id, static_cast<int>(pos)); e != ncclSuccess)
        return makeError("NCCL: rank ", me, " joining its group over axis ", axis, " (", G, " processes from rank ", leader,
                         "; this one on GPU ", dev(0).device, ") failed: ", ncclLib_->getErrorString(e));
      comms_[0][axis] = c;
      allComms_.push_back(c);
    }
    return {};
  }

  void abortCommunicators() {
    if (!ncclLib_) return;
    for (ncclComm_t c : allComms_) ncclLib_->commAbort(c);
    allComms_.clear();
    comms_.clear();
    prepared_ = false;  // the communicators are gone: a new prepare() is needed
  }

  // A kernel launch whose first arguments are raw device addresses (the collectives' kernels).
  Result<Launch> rawKernel(DeviceCtx& d, const KernelSpec& k, const std::vector<uint64_t>& ptrs, const std::string& op,
                           const std::string& what) {
    Launch l;
    l.kind = Launch::Kernel;
    TPC_ASSIGN(l.fn, function(d, k, what));
    l.grid = k.grid;
    l.block = k.block;
    l.op = op;
    l.what = what;
    for (size_t i = 0; i < k.args.size(); ++i) l.argv.push_back(i < ptrs.size() ? ptrs[i] : static_cast<uint64_t>(k.args[i].i));
    return l;
  }

  // The NCCL launches of collective `n` of rank r (staging copies around it where needsStaging).
  Status ncclLaunches(size_t r, const Node& n, char* ws, std::vector<Launch>& out) {
    Rank& rk = ranks_[r];
    DeviceCtx& d = dev(r);
    const std::string& axis = n.getStr("axis");
    std::string what = cat(rankPrefix(r), "NCCL ", n.opName(), " over ", axis, " -> ", n.result()->ref());
    Launch l;
    l.kind = Launch::Nccl;
    l.comm = comms_[r].at(axis);
    l.op = cat("NCCL ", n.opName());
    l.what = what;
    DType t = n.result()->dtype();
    TPC_ASSIGN(l.ncclType, ncclType(t));
    l.redOp = n.op() != OpKind::AllGather && n.getStr("op") == "max" ? ncclMax : ncclSum;
    char* in = static_cast<char*>(rk.addr[n.operand(0)]);
    char* res = static_cast<char*>(rk.addr[n.result()]);
    int64_t G = ranks_[0].graph->mesh().axisSize(axis), esize = dtypeSize(t);
    const Shape &inShape = n.operand(0)->shape(), &outShape = n.result()->shape();
    int64_t inNumel = n.operand(0)->type().numel(), outNumel = n.result()->type().numel();
    bool stage = needsStaging(n);
    switch (n.op()) {
      case OpKind::AllReduce:
        l.ncclOp = 0, l.a = in, l.c = res, l.bytes = static_cast<size_t>(outNumel);
        out.push_back(l);
        return {};
      case OpKind::AllGather: {
        l.ncclOp = 1, l.a = in, l.c = stage ? ws : res, l.bytes = static_cast<size_t>(inNumel);
        out.push_back(l);
        if (!stage) return {};
        int64_t dim = n.getInt("dim") < 0 ? n.getInt("dim") + n.result()->type().rank() : n.getInt("dim");
        for (int64_t q = 0; q < G; ++q) {
          std::vector<uint64_t> ptrs = {reinterpret_cast<uint64_t>(res), reinterpret_cast<uint64_t>(ws + q * inNumel * esize)};
          auto k = rawKernel(d, virtualAllGatherPiece(t, inShape, outShape, dim, static_cast<int>(q)), ptrs, l.op,
                             what + " (unstaging)");
          if (!k.ok()) return Error{k.error()};
          out.push_back(std::move(k).value());
        }
        return {};
      }
      case OpKind::ReduceScatter: {
        if (stage) {
          int64_t dim = n.getInt("dim") < 0 ? n.getInt("dim") + n.operand(0)->type().rank() : n.getInt("dim");
          std::vector<int64_t> inStrides = codegen::strides(inShape), outStrides = codegen::strides(outShape);
          for (int64_t q = 0; q < G; ++q) {
            KernelSpec pack = codegen::stridedCopy(t, outShape, 0, outStrides, q * outShape[dim] * inStrides[dim], inStrides,
                                                   {ArgKind::Int64, 0, 0}, {ArgKind::Int64, 0, 0});
            std::vector<uint64_t> ptrs = {reinterpret_cast<uint64_t>(ws + q * outNumel * esize), reinterpret_cast<uint64_t>(in)};
            auto k = rawKernel(d, pack, ptrs, l.op, what + " (staging)");
            if (!k.ok()) return Error{k.error()};
            out.push_back(std::move(k).value());
          }
        }
        l.ncclOp = 2, l.a = stage ? ws : in, l.c = res, l.bytes = static_cast<size_t>(outNumel);
        out.push_back(l);
        return {};
      }
      default: return makeError("cuda backend: no NCCL lowering for ", n.opName());
    }
  }

  // Buffers and their lifetimes (memory_plan.h); outputs that replace a parameter write into it when safe.
  Status planRank(size_t r, const std::vector<NodeLowering>& lowerings, StepMemoryPlan& plan) {
    Rank& rk = ranks_[r];
    const Graph& g = *rk.graph;
    for (Value* p : g.params()) {
      if (rk.borrowed.count(p->name())) continue;  // borrowState() set its buffer
      rk.params[p->name()] = {p, nullptr};
      rk.stateBytes += (p->type().bytes() + 255) / 256 * 256;
    }
    for (Value* v : g.inputs()) rk.inputBytes += (v->type().bytes() + 255) / 256 * 256;
    std::vector<int64_t> workspace;
    for (const NodeLowering& l : lowerings) workspace.push_back(l.workspaceBytes);
    // On the communication stream a collective's buffers stay live until its join (memory_plan.h).
    bool ncclRanks = nccl_;
    auto onCommStream = [ncclRanks](const Node& n) {
      return ncclRanks ? n.has(traits::Collective) : nodeExec(n) == NodeExec::Collective;
    };
    auto isCopy = [&rk](const Value* v) { return rk.copies.contains(v); };
    plan = commStream_ ? planStepMemory(g, workspace, &rk.groupOf, 256, onCommStream, isCopy)
                       : planStepMemory(g, workspace, &rk.groupOf, 256, {}, isCopy);
    rk.arenaBytes = plan.arenaBytes;
    for (const Value* c : rk.copies) rk.stateBytes += (c->type().bytes() + 255) / 256 * 256;  // after the parameters
    // Parameters an output replaces that no gated AdamW kernel writes: kept aside for non-finite steps.
    for (size_t i = 0; i < g.outputs().size(); ++i) {
      auto it = rk.params.find(g.outputName(i));
      if (it == rk.params.end()) continue;
      const Value *v = g.outputs()[i].value, *p = it->second.first, *root = plan.viewOf.lookup(v);
      if (v == p || root == p) continue;  // the parameter itself: nothing changes it
      const FusionGroup* fg = v->def() ? rk.groupOf.lookup(v->def()) : nullptr;
      if (fg && isAdamWGroup(*fg)) continue;
      rk.keptParams.push_back({p->name(), rk.keptBytes, p->type().bytes()});
      rk.keptBytes += (p->type().bytes() + 255) / 256 * 256;
    }
    inPlace_.push_back(plan.inPlace);
    return {};
  }

  Status allocateRank(size_t r, const TensorMap& state, const StepMemoryPlan& plan) {
    Rank& rk = ranks_[r];
    const Mesh& mesh = rk.graph->mesh();
    if (!rk.arenaBorrowed) {
      CU_TRY(cudaMalloc(&rk.arena, std::max<int64_t>(rk.arenaBytes, 256)), rankPrefix(r), "allocating the ",
             mib(rk.arenaBytes), " activations arena");
      rk.allocations.push_back(rk.arena);
    }
    for (auto& [v, b] : plan.bufferOf) rk.addr[v] = static_cast<char*>(rk.arena) + plan.buffers[b].offset;
    for (Value* v : rk.graph->inputs()) {
      void* p = nullptr;
      CU_TRY(cudaMalloc(&p, std::max<int64_t>(v->type().bytes(), 1)), "allocating input %", v->name());
      rk.allocations.push_back(p);
      rk.addr[v] = p;
    }
    if (rk.stateBytes > 0) {
      CU_TRY(cudaMalloc(&rk.state, rk.stateBytes), rankPrefix(r), "allocating ", mib(rk.stateBytes), " of parameters and optimizer state");
      rk.allocations.push_back(rk.state);
    }
    if (rk.keptBytes > 0) {
      CU_TRY(cudaMalloc(&rk.kept, rk.keptBytes), rankPrefix(r), "allocating ", mib(rk.keptBytes), " to keep the state of a step");
      rk.allocations.push_back(rk.kept);
    }
    int64_t stateOffset = 0;
    bool drew = false;
    for (Value* p : rk.graph->params()) {
      if (rk.borrowed.count(p->name())) {  // CudaOptions::stateSource's buffer (borrowState): nothing to upload
        rk.addr[p] = rk.params[p->name()].second;
        continue;
      }
      auto it = state.find(p->name());
      if (it == state.end())
        return makeError("cuda backend: no initial value for parameter %", p->name(), " of graph @", rk.graph->name());
      HostTensor t = it->second;
      const bool zeros = t.untouchedZeros();  // AdamW moments at the start: clear instead of uploading
      // A parameter initParam left to draw: drawn here on the GPU (the same bits as the host draw) unless it
      // must be sliced for a mesh or converted first.
      const HostTensor::NormalDraw* draw = t.pendingNormalDraw();
      if (draw && (!mesh.empty() || t.type() != p->type())) draw = nullptr;
      if (!draw) {
        TPC_ASSIGN(t, rankBlock(t, *p, r, "parameter"));
      }
      void* buf = static_cast<char*>(rk.state) + stateOffset;
      stateOffset += (p->type().bytes() + 255) / 256 * 256;  // as planRank counted stateBytes
      if (draw) TPC_TRY(drawOnGpu(r, buf, p->type().numel(), *draw, p->name()));
      else if (zeros) CU_TRY(cudaMemset(buf, 0, t.bytes()), "clearing parameter %", p->name());
      else CU_TRY(cudaMemcpy(buf, std::as_const(t).raw(), t.bytes(), cudaMemcpyHostToDevice), "uploading parameter %", p->name());
      drew |= draw != nullptr;
      rk.addr[p] = buf;
      rk.params[p->name()].second = buf;
    }
    if (drew) CU_TRY(cudaDeviceSynchronize(), rankPrefix(r), "drawing the parameters on the GPU");
    for (const Value* c : rk.copies) {  // written by the first step's cast group (copiesFresh_ is false)
      rk.addr[c] = static_cast<char*>(rk.state) + stateOffset;
      stateOffset += (c->type().bytes() + 255) / 256 * 256;
    }
    for (auto& [v, name] : inPlace_[r]) rk.addr[v] = rk.params[name].second;
    for (auto& [v, owner] : plan.viewOf) {  // no copy, no buffer of its own
      void* at = rk.addr.lookup(owner);
      if (!at) return makeError("cuda backend: internal error: the view ", v->ref(), " aliases a value with no memory");
      rk.addr[v] = at;
    }
    return {};
  }

  // n f32 elements of a deferred normal draw (param_draw.h) into buf on rank r's GPU, on the legacy default
  // stream: ordered before the synchronous copies and clears of the other parameters and the first step.
  Status drawOnGpu(size_t r, void* buf, int64_t n, const HostTensor::NormalDraw& draw, const std::string& name) {
    KernelSpec k = normalDrawKernel(n, draw.key, draw.scale);
    TPC_ASSIGN(CUfunction fn, function(dev(r), k, "drawing parameter %" + name));
    long long count = n, key = static_cast<long long>(draw.key);
    float scale = draw.scale;
    void* args[] = {&buf, &count, &key, &scale};
    if (CUresult e = driver_->launchKernel(fn, k.grid.x, 1, 1, k.block.x, 1, 1, 0, nullptr, args, nullptr); e != CUDA_SUCCESS)
      return makeError("cuda: drawing parameter %", name, " on the GPU failed: ", driverError(e));
    return {};
  }

  // The TMA descriptor of `m` at `addr`: row-major [rows, cols] bf16, [boxRows, boxCols] tiles, 128-byte swizzle.
  Result<Launch::Map> encodeTensorMap(const TensorMapSpec& m, void* addr, const std::string& what) {
    Launch::Map map{};
    cuuint64_t dims[2] = {static_cast<cuuint64_t>(m.cols), static_cast<cuuint64_t>(m.rows)};
    cuuint64_t strides[1] = {static_cast<cuuint64_t>(m.cols) * 2};
    cuuint32_t box[2] = {m.boxCols, m.boxRows}, elementStrides[2] = {1, 1};
    CUresult e = driver_->tensorMapEncodeTiled(reinterpret_cast<CUtensorMap*>(&map), CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, addr,
                                               dims, strides, box, elementStrides, CU_TENSOR_MAP_INTERLEAVE_NONE,
                                               CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                                               CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (e != CUDA_SUCCESS)
      return makeError("cuda: ", what, ": cannot make the TMA descriptor of a [", m.rows, ", ", m.cols, "] tensor: ", driverError(e));
    return map;
  }

  // Every kernel of the ranks' lowerings compiled before the launches load them, on NvrtcCompiler::compileAll's
  // threads (TPC_COMPILE_THREADS): a cold start costs about the slowest kernel's compile, not the sum.
  Status compileKernels(const std::vector<std::vector<NodeLowering>>& lowerings) {
    TPC_ASSIGN(int threads, compileThreadsFromEnv());
    std::vector<KernelSource> kernels;
    for (const auto& rankLowerings : lowerings)
      for (const NodeLowering& nl : rankLowerings)
        for (const KernelSpec& k : nl.kernels) kernels.push_back({&k.source, k.entry, k.archSpecific});
    return compiler_->compileAll(kernels, threads);
  }

  // The kernel loaded on d's GPU (its context must be current).
  Result<CUfunction> function(DeviceCtx& d, const KernelSpec& k, const std::string& what) {
    std::string key = k.entry + (k.archSpecific ? "\na\n" : "\n") + k.source;
    auto it = d.functions.find(key);
    if (it != d.functions.end()) return it->second;
    TPC_ASSIGN(std::vector<char> cubin, compiler_->compile(k.source, k.entry, k.archSpecific));
    CUmodule mod;
    CUfunction fn;
    if (CUresult e = driver_->moduleLoadData(&mod, cubin.data()); e != CUDA_SUCCESS)
      return makeError("cuda: loading the cubin of kernel ", k.entry, " (", what, ") failed: ", driverError(e));
    if (CUresult e = driver_->moduleGetFunction(&fn, mod, k.entry.c_str()); e != CUDA_SUCCESS)
      return makeError("cuda: kernel ", k.entry, " (", what, ") is not in its source: ", driverError(e));
    d.functions[key] = fn;
    return fn;
  }

  // A persistent kernel launched in clusters of `clusterX` blocks (its __cluster_dims__) must be one wave: its grid
  // is lowered to the clusters that fit on the GPU at once (whole GPCs' pairs of SMs, not every SM), else the
  // clusters past them would wait for the first ones to finish all their tiles.
  Status fitClusters(Launch& l, uint32_t clusterX) const {
    CUlaunchConfig config{};
    config.gridDimX = l.grid.x;
    config.gridDimY = l.grid.y;
    config.gridDimZ = l.grid.z;
    config.blockDimX = l.block.x;
    config.blockDimY = l.block.y;
    config.blockDimZ = l.block.z;
    config.sharedMemBytes = l.smem;
    int clusters = 0;
    if (CUresult e = driver_->occupancyMaxActiveClusters(&clusters, l.fn, &config); e != CUDA_SUCCESS)
      return makeError("cuda: ", l.what, ": cannot read how many clusters of ", clusterX, " blocks fit at once: ", driverError(e),
                       " (TPC_OWN_GEMM without multicast runs it without clusters)");
    if (clusters < 1)
      return makeError("cuda: ", l.what, ": no cluster of ", clusterX, " blocks with ", l.smem, " bytes of shared memory each fits ",
                       "on this GPU (TPC_OWN_GEMM without multicast runs it without clusters)");
    l.grid.x = std::min(l.grid.x, static_cast<uint32_t>(clusters) * clusterX);
    return {};
  }

  std::string driverError(CUresult e) const {
    const char* s = nullptr;
    driver_->getErrorString(e, &s);
    return s ? s : cat("CUresult ", int(e));
  }

  static char* workspace(const Rank& rk, const StepMemoryPlan& plan, size_t k) {
    int b = plan.workspaceOf[k];
    return b >= 0 ? static_cast<char*>(rk.arena) + plan.buffers[b].offset : nullptr;
  }

  Status buildLaunches(size_t r, std::vector<NodeLowering>& lowerings, const std::vector<int>& matmulPlans,
                       const StepMemoryPlan& plan) {
    Rank& rk = ranks_[r];
    DeviceCtx& d = dev(r);
    CU_TRY(cudaSetDevice(d.device), "GPU ", d.device);
    std::vector<Node*> nodes = rk.graph->nodeVector();
    rk.segments.emplace_back();
    // Checking mode: a node's results are complete after its last launch. A node without launches of its
    // own (a virtual collective, run in assemble(); one lowered to nothing) is checked after the next launch.
    std::vector<std::pair<size_t, int>> pending;
    size_t launched = 0;
    auto attachChecks = [&] {
      std::vector<Launch>& seg = rk.segments.back();
      size_t now = 0;
      for (auto& s : rk.segments) now += s.size();
      if (now == launched || seg.empty()) return;
      launched = now;
      seg.back().checks.insert(seg.back().checks.end(), pending.begin(), pending.end());
      pending.clear();
    };
    // The bytes each launch reads and writes (the communication stream's schedule): a node's launches read
    // its (group's) operands and write its results, and its workspace both. Set on the launches a node
    // added, when the next node starts.
    Launch touched;
    size_t untouched = 0;
    auto attachRanges = [&] {
      std::vector<Launch>& seg = rk.segments.back();
      for (size_t i = std::min(untouched, seg.size()); i < seg.size(); ++i) {
        if (seg[i].collective < 0) seg[i].collective = touched.collective;
        seg[i].reads.insert(seg[i].reads.end(), touched.reads.begin(), touched.reads.end());
        seg[i].writes.insert(seg[i].writes.end(), touched.writes.begin(), touched.writes.end());
      }
      untouched = seg.size();
    };
    auto range = [&](const Value* v) {
      auto at = reinterpret_cast<uintptr_t>(rk.addr.lookup(v));
      return ByteRange{at, at ? at + static_cast<uintptr_t>(v->type().bytes()) : 0};
    };
    int ncclCollectives = 0;
    // An AdamW group's members are checked after its kernel (other nodes' launches may come in between).
    std::map<const FusionGroup*, std::vector<std::pair<size_t, int>>> adamwMembers;
    for (size_t k = 0; k < nodes.size(); ++k) {
      const Node& n = *nodes[k];
      attachChecks();  // the previous node's
      attachRanges();
      pending.push_back({r, static_cast<int>(k)});
      std::string what = cat(rankPrefix(r), n.opName(), " -> ", n.result()->ref());
      std::string op(n.opName());
      // A fusion group's kernel (at its last member) reads the group's inputs and writes its outputs.
      const FusionGroup* fg = rk.groupOf.lookup(&n);
      if (fg && isAdamWGroup(*fg)) {
        if (fg->members.back() != &n) {
          adamwMembers[fg].push_back(pending.back());
          pending.pop_back();
          continue;
        }
        pending.insert(pending.begin(), adamwMembers[fg].begin(), adamwMembers[fg].end());
      }
      if (fg) what = cat(rankPrefix(r), groupName(*fg), " -> ", fg->outputs.front()->ref());
      if (fg) op = isCastGroup(*fg) ? std::string("cast (multi-tensor)") : cat("fusion_group=", fg->id);
      llvm::ArrayRef<Value*> operands = fg ? llvm::ArrayRef<Value*>(fg->inputs) : n.operands();
      llvm::ArrayRef<Value*> results = fg ? llvm::ArrayRef<Value*>(fg->outputs) : n.results();
      touched = Launch();
      for (const Value* v : operands) touched.reads.push_back(range(v));
      for (const Value* v : results) touched.writes.push_back(range(v));
      if (char* ws = workspace(rk, plan, k)) {
        auto at = reinterpret_cast<uintptr_t>(ws);
        ByteRange w{at, at + static_cast<uintptr_t>(lowerings[k].workspaceBytes)};
        touched.reads.push_back(w);
        touched.writes.push_back(w);
      }
      if (nccl_ && n.has(traits::Collective)) {
        char* ws = workspace(rk, plan, k);
        touched.collective = ncclCollectives++;
        TPC_TRY(ncclLaunches(r, n, ws, rk.segments.back()));
        continue;
      }
      switch (nodeExec(n)) {
        case NodeExec::Collective:
          pending.pop_back();  // assemble() checks it after the collective's kernels
          rk.collectives.push_back(&n);
          rk.collectiveIndex.push_back(static_cast<int>(k));
          rk.segments.emplace_back();
          untouched = 0;
          continue;
        case NodeExec::Matmul: {
          if (matmulPlans[k] < 0) break;  // a GEMM kernel of ours (lowerGemm): launched as kernels below
          for (const auto& [oa, ob, oc] : matmulCalls[r][k]) {
            Launch l;
            l.kind = Launch::Matmul;
            l.matmul = matmulPlans[k];
            l.a = static_cast<const char*>(rk.addr[n.operand(0)]) + oa * dtypeSize(n.operand(0)->dtype());
            l.b = static_cast<const char*>(rk.addr[n.operand(1)]) + ob * dtypeSize(n.operand(1)->dtype());
            l.c = static_cast<char*>(rk.addr[n.result()]) + oc * dtypeSize(n.result()->dtype());
            auto [bias, aux, residual] = epilogueValues(n);
            l.epi = {bias ? rk.addr[bias] : nullptr, aux ? rk.addr[aux] : nullptr, residual ? rk.addr[residual] : nullptr};
            l.op = op;
            l.what = what;
            l.flops = dev(r).matmul->flops(matmulPlans[k]);
            l.gemm = dev(r).matmul->what(matmulPlans[k]);
            rk.segments.back().push_back(l);
          }
          continue;
        }
        case NodeExec::View: continue;
        case NodeExec::Kernels: break;
      }
      NodeLowering& nl = lowerings[k];
      char* ws = workspace(rk, plan, k);
      if (int id = attentionPlans_[r][k]; id >= 0) {
        std::vector<void*> in, out;
        for (const Value* v : n.operands()) in.push_back(rk.addr[v]);
        for (const Value* v : n.results()) out.push_back(rk.addr[v]);
        Launch l;
        l.kind = Launch::Cudnn;
        auto bound = d.attention->bind(id, in, out, ws);
        if (!bound.ok()) return makeError("cuda: ", what, ": ", bound.error());
        l.cudnn = *bound;
        l.op = op;
        l.what = what + " [cuDNN]";
        l.flops = d.attention->flops(id);
        l.gemm = d.attention->what(id);
        rk.segments.back().push_back(l);
        continue;
      }
      if (ws && nl.zeroWorkspace) {
        Launch l;
        l.kind = Launch::Memset;
        l.c = ws;
        l.bytes = static_cast<size_t>(nl.workspaceBytes);
        l.op = op;
        l.what = what;
        rk.segments.back().push_back(l);
      }
      for (const KernelSpec& ks : nl.kernels) {
        Launch l;
        l.kind = Launch::Kernel;
        auto fn = function(d, ks, what);
        if (!fn.ok()) return Error{fn.error()};
        l.fn = *fn;
        if (ks.requiredRegisters > 0) {
          int regs = 0;
          if (CUresult e = driver_->funcGetAttribute(&regs, CU_FUNC_ATTRIBUTE_NUM_REGS, l.fn); e != CUDA_SUCCESS)
            return makeError("cuda: ", what, " [", ks.entry, "]: cannot read its register count: ", driverError(e));
          if (regs != ks.requiredRegisters)
            return makeError("cuda: ", what, " [", ks.entry, "]: this CUDA's ptxas gave it ", regs, " registers a thread, its ",
                             "warp specialization needs ", ks.requiredRegisters, " (TPC_OWN_GEMM=0 runs cuBLASLt instead)");
        }
        l.grid = ks.grid;
        l.block = ks.block;
        l.smem = ks.sharedBytes;
        l.op = op;
        l.what = what + " [" + ks.entry + "]";
        if (nodeExec(n) == NodeExec::Matmul && ks.archSpecific) {  // our GEMM kernel: the step profile's per-GEMM row
          const Value* a = n.operand(0);
          int64_t K = a->shape().back();
          l.flops = 2.0 * static_cast<double>(n.result()->type().numel()) * static_cast<double>(K);
          l.gemm = cat("matmul ", a->type().str(), " x ", n.operand(1)->type().str(), " with epilogue ", n.getStr("epilogue"),
                       n.numOperands() == 4 ? "+residual" : "", " (", ks.entry, ")");  // as cuBLASLt's rows say it
        }
        if (ks.sharedBytes > 48 * 1024)
          if (CUresult e = driver_->funcSetAttribute(l.fn, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                                     static_cast<int>(ks.sharedBytes));
              e != CUDA_SUCCESS)
            return makeError("cuda: ", l.what, ": cannot use ", ks.sharedBytes, " bytes of shared memory: ", driverError(e));
        l.clusterX = ks.clusterX;
        if (ks.clusterX > 1) TPC_TRY(fitClusters(l, ks.clusterX));
        for (const KernelArg& a : ks.args) {
          uint64_t v = 0;
          switch (a.kind) {
            case ArgKind::Operand:
              if (a.index < 0 || a.index >= static_cast<int64_t>(operands.size()))
                return makeError("cuda: ", l.what, ": bad operand index ", a.index);
              v = reinterpret_cast<uint64_t>(rk.addr[operands[a.index]]);
              break;
            case ArgKind::Result:
              if (a.index < 0 || a.index >= static_cast<int64_t>(results.size()))
                return makeError("cuda: ", l.what, ": bad result index ", a.index);
              v = reinterpret_cast<uint64_t>(rk.addr[results[a.index]]);
              break;
            case ArgKind::Workspace: v = reinterpret_cast<uint64_t>(ws + a.index); break;
            case ArgKind::Int64: v = static_cast<uint64_t>(a.i); break;
            case ArgKind::Float: {
              float f = static_cast<float>(a.f);
              std::memcpy(&v, &f, sizeof f);
              break;
            }
            case ArgKind::Seed: v = options_.seed; break;
            case ArgKind::StepPtr: v = reinterpret_cast<uint64_t>(d.stepWord); break;
            case ArgKind::HoldPtr: v = reinterpret_cast<uint64_t>(d.holdWord); break;
            case ArgKind::FreshPtr: v = reinterpret_cast<uint64_t>(d.freshWord); break;
            case ArgKind::Table: {
              if (a.index < 0 || a.index >= static_cast<int64_t>(ks.tables.size()))
                return makeError("cuda: ", l.what, ": bad address table ", a.index);
              std::vector<uint64_t> addresses;
              for (const KernelArg& e : ks.tables[a.index]) {
                bool operand = e.kind == ArgKind::Operand;
                if ((!operand && e.kind != ArgKind::Result) || e.index < 0 ||
                    e.index >= static_cast<int64_t>(operand ? operands.size() : results.size()))
                  return makeError("cuda: ", l.what, ": bad address table entry ", e.index);
                addresses.push_back(reinterpret_cast<uint64_t>(rk.addr[operand ? operands[e.index] : results[e.index]]));
              }
              void* t = nullptr;
              CU_TRY(cudaMalloc(&t, std::max<size_t>(addresses.size(), 1) * sizeof(uint64_t)), l.what, " (its address table)");
              rk.allocations.push_back(t);
              CU_TRY(cudaMemcpy(t, addresses.data(), addresses.size() * sizeof(uint64_t), cudaMemcpyHostToDevice), l.what,
                     " (its address table)");
              v = reinterpret_cast<uint64_t>(t);
              break;
            }
            case ArgKind::TensorMap: {
              if (a.index < 0 || a.index >= static_cast<int64_t>(ks.maps.size()))
                return makeError("cuda: ", l.what, ": bad tensor map ", a.index);
              const TensorMapSpec& m = ks.maps[a.index];
              llvm::ArrayRef<Value*> values = m.operand ? operands : results;
              if (m.index < 0 || m.index >= static_cast<int64_t>(values.size()))
                return makeError("cuda: ", l.what, ": bad tensor map value ", m.index);
              TPC_ASSIGN(Launch::Map map, encodeTensorMap(m, rk.addr[values[m.index]], l.what));
              v = l.maps.size();
              l.maps.push_back(map);
              l.mapArg.resize(l.argv.size() + 1, false);
              l.mapArg.back() = true;
              break;
            }
          }
          l.argv.push_back(v);
        }
        rk.segments.back().push_back(std::move(l));
      }
    }
    attachChecks();
    attachRanges();
    for (const auto& [v, name] : plan.paramCopies) {
      Launch l;
      l.kind = Launch::Copy;
      l.c = rk.params[name].second;
      l.a = rk.addr[v];
      l.bytes = static_cast<size_t>(v->type().bytes());
      l.reads.push_back(range(v));
      l.writes.push_back({reinterpret_cast<uintptr_t>(l.c), reinterpret_cast<uintptr_t>(l.c) + l.bytes});
      l.op = "update";
      l.what = cat(rankPrefix(r), "update of %", name);
      rk.segments.back().push_back(l);
    }
    attachChecks();  // nodes that only the parameter copies follow
    return {};
  }

  // All ranks' launches in one order: segment s of every rank, then collective s across the ranks.
  Status assemble() {
    for (auto& d : devs_) d.launches.clear();
    if (nccl_) {  // each rank replays its own program on its own GPU; NCCL joins them
      for (size_t r = 0; r < ranks_.size(); ++r)
        for (auto& seg : ranks_[r].segments)
          for (auto& l : seg) dev(r).launches.push_back(l);
      launchCount_ = static_cast<int64_t>(devs_[0].launches.size());
      return {};
    }
    std::vector<Launch>& launches_ = devs_[0].launches;
    size_t segs = ranks_[0].segments.size();
    for (size_t r = 1; r < ranks_.size(); ++r)
      if (ranks_[r].segments.size() != segs)
        return makeError("cuda backend: rank ", r, " has ", ranks_[r].collectives.size(), " collectives, rank 0 ",
                         ranks_[0].collectives.size(), " (the rank graphs are inconsistent)");
    const Mesh& mesh = ranks_[0].graph->mesh();
    for (size_t s = 0; s < segs; ++s) {
      for (auto& rk : ranks_)
        for (auto& l : rk.segments[s]) launches_.push_back(l);
      if (s + 1 < segs) TPC_TRY(collective(s, mesh));
    }
    launchCount_ = static_cast<int64_t>(launches_.size());
    return {};
  }

  Status collective(size_t s, const Mesh& mesh) {
    const Node& n0 = *ranks_[0].collectives[s];
    const std::string& axis = n0.getStr("axis");
    int ai = mesh.axisIndex(axis);
    int64_t G = mesh.axisSize(axis);
    for (size_t r = 1; r < ranks_.size(); ++r) {
      const Node& n = *ranks_[r].collectives[s];
      if (n.op() != n0.op() || n.getStr("axis") != axis || n.operand(0)->type() != n0.operand(0)->type())
        return makeError("cuda backend: collective ", s, " differs between rank 0 (", n0.opName(), " over ", axis,
                         ") and rank ", r, " (", n.opName(), " over ", n.getStr("axis"), ")");
    }
    // Row-major rank numbering over the mesh axes (the last fastest): the stride of axis ai.
    int64_t stride = 1;
    for (size_t a = mesh.axes.size(); a-- > static_cast<size_t>(ai) + 1;) stride *= mesh.axes[a].size;
    std::string what = cat(n0.opName(), " over ", axis, " -> ", n0.result()->ref());
    for (size_t r = 0; r < ranks_.size(); ++r) {
      int64_t coord = (static_cast<int64_t>(r) / stride) % G;
      if (coord != 0) continue;  // each group once, from its first member
      std::vector<size_t> members;
      for (int64_t q = 0; q < G; ++q) members.push_back(r + q * stride);
      auto in = [&](size_t q) { return reinterpret_cast<uint64_t>(ranks_[members[q]].addr[ranks_[members[q]].collectives[s]->operand(0)]); };
      auto out = [&](size_t q) { return reinterpret_cast<uint64_t>(ranks_[members[q]].addr[ranks_[members[q]].collectives[s]->result()]); };
      DType t = n0.result()->dtype();
      bool max = n0.op() != OpKind::AllGather && n0.getStr("op") == "max";
      std::vector<std::pair<KernelSpec, std::vector<uint64_t>>> ks;
      if (n0.op() == OpKind::AllReduce) {
        std::vector<uint64_t> ptrs;
        for (int64_t q = 0; q < G; ++q) ptrs.push_back(in(q));
        for (int64_t q = 0; q < G; ++q) ptrs.push_back(out(q));
        ks.push_back({virtualAllReduce(t, static_cast<int>(G), max, n0.result()->type().numel()), ptrs});
      } else if (n0.op() == OpKind::ReduceScatter) {
        TPC_ASSIGN(int64_t dim, normalizeDim(n0.getInt("dim"), n0.operand(0)->type().rank()));
        for (int64_t q = 0; q < G; ++q) {
          std::vector<uint64_t> ptrs;
          for (int64_t p = 0; p < G; ++p) ptrs.push_back(in(p));
          ptrs.push_back(out(q));
          ks.push_back({virtualReduceScatter(t, static_cast<int>(G), max, n0.operand(0)->shape(), dim, static_cast<int>(q)), ptrs});
        }
      } else if (n0.op() == OpKind::AllGather) {
        TPC_ASSIGN(int64_t dim, normalizeDim(n0.getInt("dim"), n0.operand(0)->type().rank()));
        // One launch for the group (G x G strided copies were 8,320 launches a step of gpt-6.7b at tp 8 --sp).
        std::vector<uint64_t> ptrs;
        for (int64_t q = 0; q < G; ++q) ptrs.push_back(in(q));
        for (int64_t q = 0; q < G; ++q) ptrs.push_back(out(q));
        ks.push_back({virtualAllGather(t, static_cast<int>(G), n0.operand(0)->shape(), dim), ptrs});
      } else {
        return makeError("cuda backend: no virtual-rank lowering for collective ", n0.opName());
      }
      // What the group's kernels read and write: every member's input and output.
      std::vector<ByteRange> reads, writes;
      for (int64_t q = 0; q < G; ++q) {
        const Node& n = *ranks_[members[q]].collectives[s];
        reads.push_back({in(q), in(q) + static_cast<uintptr_t>(n.operand(0)->type().bytes())});
        writes.push_back({out(q), out(q) + static_cast<uintptr_t>(n.result()->type().bytes())});
      }
      for (auto& [k, ptrs] : ks) {
        TPC_ASSIGN(Launch l, rawKernel(devs_[0], k, ptrs, std::string(n0.opName()), what));
        l.collective = static_cast<int>(s);
        l.reads = reads;
        l.writes = writes;
        devs_[0].launches.push_back(std::move(l));
      }
    }
    // Checking mode: every rank's result of this collective is complete now.
    for (size_t r = 0; r < ranks_.size(); ++r) devs_[0].launches.back().checks.push_back({r, ranks_[r].collectiveIndex[s]});
    return {};
  }

  static Result<int64_t> normalizeDim(int64_t d, int64_t rank) {
    if (d < 0) d += rank;
    if (d < 0 || d >= rank) return makeError("cuda backend: collective dim ", d, " out of range for rank ", rank);
    return d;
  }

  // On `stream` (null: d's compute stream).
  Status enqueue(DeviceCtx& d, const Launch& l, cudaStream_t stream = nullptr) {
    cudaStream_t st = stream ? stream : d.stream;
    switch (l.kind) {
      case Launch::Kernel: {
        std::vector<void*> params;
        for (size_t i = 0; i < l.argv.size(); ++i)
          params.push_back(i < l.mapArg.size() && l.mapArg[i] ? static_cast<void*>(const_cast<Launch::Map*>(&l.maps[l.argv[i]]))
                                                              : static_cast<void*>(const_cast<uint64_t*>(&l.argv[i])));
        CUresult e = driver_->launchKernel(l.fn, l.grid.x, l.grid.y, l.grid.z, l.block.x, l.block.y, l.block.z, l.smem,
                                           reinterpret_cast<CUstream>(st), params.data(), nullptr);
        if (e != CUDA_SUCCESS) return makeError("cuda: launching ", l.what, ": ", driverError(e));
        return {};
      }
      case Launch::Matmul: return d.matmul->run(l.matmul, l.a, l.b, l.c, l.epi, d.matmulWorkspace, st);
      case Launch::Cudnn: return d.attention->run(l.cudnn, st);
      case Launch::Memset: CU_TRY(cudaMemsetAsync(l.c, 0, l.bytes, st), l.what, " (zeroing its workspace)"); return {};
      case Launch::Copy: CU_TRY(cudaMemcpyAsync(l.c, l.a, l.bytes, cudaMemcpyDeviceToDevice, st), l.what); return {};
      case Launch::Nccl: {
        ncclResult_t e = ncclSuccess;
        if (l.ncclOp == 0) e = ncclLib_->allReduce(l.a, l.c, l.bytes, l.ncclType, l.redOp, l.comm, st);
        else if (l.ncclOp == 1) e = ncclLib_->allGather(l.a, l.c, l.bytes, l.ncclType, l.comm, st);
        else e = ncclLib_->reduceScatter(l.a, l.c, l.bytes, l.ncclType, l.redOp, l.comm, st);
        if (e != ncclSuccess) return makeError(l.what, " failed: ", ncclLib_->getErrorString(e));
        return {};
      }
    }
    return {};
  }

  Status enqueueAll(DeviceCtx& d, bool syncEach, int64_t stepIndex) {
    for (const Launch& l : d.launches) {
      TPC_TRY(enqueue(d, l));
      if (syncEach) {
        cudaError_t e = cudaStreamSynchronize(d.stream);
        if (e != cudaSuccess) return makeError("cuda: step ", stepIndex, ": ", l.what, " failed: ", cudaGetErrorString(e));
      }
    }
    return {};
  }

  // The profiled step: the same launches as the step graph with a timing event after each, captured as a
  // graph of their own (so no host launch gap is timed) and replayed once in place of the step graph.
  Status launchProfiled(DeviceCtx& d, int64_t stepIndex) {
    std::vector<cudaEvent_t> ev(d.launches.size() + 1, nullptr);
    for (auto& e : ev) CU_TRY(cudaEventCreate(&e), "creating a profiling event");
    auto destroy = [&] {
      for (auto& e : ev) cudaEventDestroy(e);
    };
    cudaGraph_t graph = nullptr;
    cudaGraphExec_t exec = nullptr;
    Status st = [&]() -> Status {
      CU_TRY(cudaStreamBeginCapture(d.stream, cudaStreamCaptureModeThreadLocal), "beginning the profiling capture");
      Status s = [&]() -> Status {
        CU_TRY(cudaEventRecordWithFlags(ev[0], d.stream, cudaEventRecordExternal), "profiling event");
        for (size_t i = 0; i < d.launches.size(); ++i) {
          TPC_TRY(enqueue(d, d.launches[i]));
          CU_TRY(cudaEventRecordWithFlags(ev[i + 1], d.stream, cudaEventRecordExternal), "profiling event");
        }
        return {};
      }();
      cudaError_t e = cudaStreamEndCapture(d.stream, &graph);
      TPC_TRY(s);
      CU_TRY(e, "capturing the profiled step");
      CU_TRY(cudaGraphInstantiate(&exec, graph, 0), "instantiating the profiled step");
      CU_TRY(cudaGraphLaunch(exec, d.stream), "step ", stepIndex, ": launching the profiled step");
      CU_TRY(cudaStreamSynchronize(d.stream), "step ", stepIndex, ": the profiled step");
      d.profile.clear();
      for (size_t i = 0; i < d.launches.size(); ++i) {
        float ms = 0;
        CU_TRY(cudaEventElapsedTime(&ms, ev[i], ev[i + 1]), "reading a profiling event");
        d.profile.push_back({d.launches[i].op, d.launches[i].what, ms, d.launches[i].gemm, d.launches[i].flops});
      }
      return {};
    }();
    if (exec) cudaGraphExecDestroy(exec);
    if (graph) cudaGraphDestroy(graph);
    destroy();
    return st;
  }

  Status printProfile(int64_t stepIndex) {
    for (size_t i = 0; i < devs_.size(); ++i) {
      DeviceCtx& d = devs_[i];
      float replay = 0;
      if (d.replayTimed && cudaEventElapsedTime(&replay, d.replayStart, d.replayEnd) != cudaSuccess) replay = 0;
      if (devs_.size() > 1) std::printf("GPU %d: ", d.device);
      std::printf("%s", formatStepProfile(d.profile, stepIndex, replay).c_str());
      if (i == 0 && devs_.size() > 1) break;  // NCCL ranks run the same program: rank 0's table stands for all
    }
    std::fflush(stdout);
    if (options_.profileCsv.empty()) return {};
    std::vector<std::pair<int, std::vector<TimedLaunch>>> all;
    for (const DeviceCtx& d : devs_) all.push_back({d.device, d.profile});
    const std::string tmp = cat(options_.profileCsv, ".tmp.", getpid());
    std::ofstream f(tmp, std::ios::trunc);
    f << formatStepProfileCsv(all);
    f.close();
    if (!f || std::rename(tmp.c_str(), options_.profileCsv.c_str()) != 0) {
      const int err = errno;
      std::remove(tmp.c_str());
      return makeError("--profile-csv ", options_.profileCsv, ": error: cannot write the file (", std::strerror(err), ")");
    }
    std::printf("profile of step %lld: every launch written to %s\n", static_cast<long long>(stepIndex),
                options_.profileCsv.c_str());
    std::fflush(stdout);
    return {};
  }

  // The captured step with the collectives on d.comm: scheduleCommStream (before the capture: it creates the
  // events) places a fork before each collective and a join before the first launch that conflicts with it;
  // enqueueWithCommStream issues them while d.stream is captured. Only the captured step does this; the
  // eager paths (TPC_CUDA_DEBUG, checking mode) and the profiled step run everything on the compute stream in
  // the same order (the profile's events between launches time one launch each only on one stream).
  Status scheduleCommStream(DeviceCtx& d) {
    std::vector<ScheduledLaunch> sl;
    for (const Launch& l : d.launches) sl.push_back({l.collective, l.reads, l.writes});
    d.schedule = cuda::scheduleCommStream(sl);
    for (cudaEvent_t e : d.commEvents) cudaEventDestroy(e);
    d.commEvents.assign(2 * d.schedule.collectives.size(), nullptr);  // [2c]: fork of collective c, [2c+1]: its end
    for (auto& e : d.commEvents) CU_TRY(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "creating a stream event");
    return {};
  }

  Status enqueueWithCommStream(DeviceCtx& d) {
    const CommSchedule& cs = d.schedule;
    for (size_t i = 0; i < d.launches.size(); ++i) {
      if (int c = cs.joinBefore[i]; c >= 0)
        CU_TRY(cudaStreamWaitEvent(d.stream, d.commEvents[2 * c + 1], 0), "joining the communication stream");
      int c = cs.collectiveOf[i];
      if (c >= 0 && cs.collectives[c].first == i && cs.collectives[c].fork) {
        CU_TRY(cudaEventRecord(d.commEvents[2 * c], d.stream), "forking the communication stream");
        CU_TRY(cudaStreamWaitEvent(d.comm, d.commEvents[2 * c], 0), "forking the communication stream");
      }
      TPC_TRY(enqueue(d, d.launches[i], c >= 0 ? d.comm : d.stream));
      if (c >= 0 && cs.collectives[c].last == i)
        CU_TRY(cudaEventRecord(d.commEvents[2 * c + 1], d.comm), "recording the end of ", d.launches[i].what);
    }
    if (cs.joinAtEnd >= 0)
      CU_TRY(cudaStreamWaitEvent(d.stream, d.commEvents[2 * cs.joinAtEnd + 1], 0), "joining the communication stream");
    return {};
  }

  // Each GPU's launches captured once as a CUDA graph (a thread per GPU, as NCCL wants its ranks' calls).
  Status capture() {
    std::vector<std::string> errors(devs_.size());
    auto one = [&](size_t i) {
      DeviceCtx& d = devs_[i];
      Status st = [&]() -> Status {
        CU_TRY(cudaSetDevice(d.device), "GPU ", d.device);
        if (d.comm) TPC_TRY(scheduleCommStream(d));
        CU_TRY(cudaStreamBeginCapture(d.stream, cudaStreamCaptureModeThreadLocal), "beginning the graph capture");
        Status s = d.comm ? enqueueWithCommStream(d) : enqueueAll(d, false, 0);
        cudaGraph_t graph = nullptr;
        cudaError_t e = cudaStreamEndCapture(d.stream, &graph);
        TPC_TRY(s);
        CU_TRY(e, "capturing the step as a CUDA graph");
        d.graph = graph;
        CU_TRY(cudaGraphInstantiate(&d.exec, d.graph, 0), "instantiating the step graph");
        return {};
      }();
      if (!st.ok()) errors[i] = st.error();
    };
    onEveryDevice(one);
    for (auto& e : errors)
      if (!e.empty()) return Error{e};
    return {};
  }

  void release() {
    for (ncclComm_t c : allComms_) ncclLib_->commDestroy(c);
    allComms_.clear();
    comms_.clear();
    for (size_t r = 0; r < ranks_.size(); ++r) {
      Rank& rk = ranks_[r];
      if (!devs_.empty()) cudaSetDevice(dev(r).device);
      for (void* p : rk.allocations) cudaFree(p);
      rk.allocations.clear();
      rk.addr.clear();
      rk.params.clear();
      rk.borrowed.clear();
      rk.segments.clear();
      rk.collectives.clear();
      rk.groups.clear();
      rk.groupOf.clear();
      rk.collectiveIndex.clear();
      rk.state = rk.kept = nullptr;
      rk.arena = nullptr;
      rk.arenaBorrowed = false;
      rk.keptParams.clear();
      rk.arenaBytes = rk.stateBytes = rk.inputBytes = rk.keptBytes = 0;
    }
    for (DeviceCtx& d : devs_) {
      cudaSetDevice(d.device);
      if (d.exec) cudaGraphExecDestroy(d.exec);
      if (d.graph) cudaGraphDestroy(d.graph);
      d.attention.reset();  // its plans and handle, on their device, before the stream it was last given
      if (d.stepWord) cudaFree(d.stepWord);
      if (d.holdWord) cudaFree(d.holdWord);
      if (d.freshWord) cudaFree(d.freshWord);
      if (d.pinned) cudaFreeHost(d.pinned);
      if (d.replayStart) cudaEventDestroy(d.replayStart);
      if (d.replayEnd) cudaEventDestroy(d.replayEnd);
      if (d.matmulWorkspace) cudaFree(d.matmulWorkspace);
      if (d.stream) cudaStreamDestroy(d.stream);
      if (d.comm) cudaStreamDestroy(d.comm);
      for (cudaEvent_t e : d.commEvents) cudaEventDestroy(e);
    }
    devs_.clear();
    inPlace_.clear();
    attentionPlans_.clear();
    attentionFallbacks_.clear();
    prepared_ = false;
    copiesFresh_ = false;
  }

  CudaOptions options_;
  std::vector<Rank> ranks_;
  std::vector<llvm::DenseMap<const Value*, std::string>> inPlace_;
  std::vector<std::vector<std::vector<std::array<int64_t, 3>>>> matmulCalls;  // rank -> node -> calls
  std::string attentionMode_;                        // auto, cudnn or tpc (CudaOptions::attention)
  std::vector<std::vector<int>> attentionPlans_;     // rank -> node -> CudnnAttention plan (-1: none)
  std::set<std::string> attentionFallbacks_;         // why cuDNN refused an attention node (each printed once)
  LoweringContext ctx_;
  bool foldLayerNormGradResidual_ = true;
  bool foldLayerNormGradBiasSum_ = true;
  bool foldLayerNormResidual_ = false;  // TPC_LN_RESIDUAL=1 (off: slower on an H100)
  // The AdamW kernels keep the parameters' 16-bit copies (adamw_groups.h; TPC_MEMBW_OFF=adamcopy: not), which
  // hold their casts while copiesFresh_: false until a step has run and after anything else writes the state.
  bool adamwCopies_ = true;
  bool copiesFresh_ = false;
  std::string deviceName_ = "GPU";
  const Driver* driver_ = nullptr;
  std::unique_ptr<NvrtcCompiler> compiler_;
  std::vector<DeviceCtx> devs_;
  bool nccl_ = false;
  bool commStream_ = false;  // the captured step runs its collectives on a communication stream
  const Nccl* ncclLib_ = nullptr;
  std::vector<std::map<std::string, ncclComm_t>> comms_;  // rank -> axis -> its group's communicator
  std::vector<ncclComm_t> allComms_;
  int64_t launchCount_ = 0;
  bool prepared_ = false, debug_ = false;
  // Between startStep() and finishStep(): the step in flight, its host copies and its timing.
  bool started_ = false;
  int64_t pendingStep_ = 0;
  RankCopies pendingCopies_;
  StepTiming timing_;
  std::optional<StepTiming> lastTiming_;
  static double msSince(std::chrono::steady_clock::time_point t) {
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t).count();
  }
};

}  // namespace

std::unique_ptr<Backend> createCudaBackend(std::vector<std::unique_ptr<Graph>> rankGraphs, CudaOptions options) {
  return std::make_unique<CudaBackend>(std::move(rankGraphs), std::move(options));
}

std::optional<CudaStepGraphInfo> cudaStepGraphInfo(const Backend& backend) {
  auto* b = dynamic_cast<const CudaBackend*>(&backend);
  return b ? b->graphInfo() : std::nullopt;
}

}  // namespace tpc
