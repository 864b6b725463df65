#include "runtime/cuda/doctor.h"

#include <cuda_runtime_api.h>

#include <cstdio>
#include <string>
#include <vector>

#include "runtime/cuda/cublaslt_matmul.h"
#include "runtime/cuda/cuda_libraries.h"
#include "runtime/cuda/device_info.h"
#include "runtime/gpu_peaks.h"

namespace tpc::cuda {
namespace {

std::string versionOf(int v) { return std::to_string(v / 1000) + "." + std::to_string((v % 1000) / 10); }

// TFLOP/s of an n x n x n bf16 matmul (fp32 accumulation) through tpc's own cuBLASLt path on `device`.
Result<double> matmulRate(int device, int n) {
  if (cudaSetDevice(device) != cudaSuccess) return makeError("cannot select GPU ", device);
  Graph g("doctor");
  Value* a = g.addInput("a", TensorType(DType::bf16, {n, n}));
  Value* b = g.addInput("b", TensorType(DType::bf16, {n, n}));
  TPC_ASSIGN(Node * mm, g.create(OpKind::Matmul, {a, b}));
  TPC_ASSIGN(auto lt, CublasLtMatmul::create(size_t(32) << 20));
  std::vector<std::array<int64_t, 3>> calls;
  TPC_ASSIGN(int plan, lt->plan(*mm, &calls));
  size_t bytes = size_t(n) * n * 2;
  void *da = nullptr, *db = nullptr, *dc = nullptr, *ws = nullptr;
  cudaStream_t stream = nullptr;
  cudaEvent_t start = nullptr, stop = nullptr;
  auto cleanup = [&] {
    cudaFree(da), cudaFree(db), cudaFree(dc), cudaFree(ws);
    if (start) cudaEventDestroy(start);
    if (stop) cudaEventDestroy(stop);
    if (stream) cudaStreamDestroy(stream);
  };
  if (cudaMalloc(&da, bytes) || cudaMalloc(&db, bytes) || cudaMalloc(&dc, bytes) || cudaMalloc(&ws, lt->workspaceBytes()) ||
      cudaStreamCreate(&stream) || cudaEventCreate(&start) || cudaEventCreate(&stop)) {
    cleanup();
    return makeError("cannot allocate ", 3 * bytes >> 20, " MiB on GPU ", device, " for the matmul test");
  }
  cudaMemsetAsync(da, 0x3c, bytes, stream);  // bf16 0x3c3c ~ 0.0115: finite, not denormal
  cudaMemsetAsync(db, 0x3c, bytes, stream);
  const int warmup = 3, iters = 20;
  for (int i = 0; i < warmup + iters; ++i) {
    if (i == warmup) cudaEventRecord(start, stream);
    if (Status s = lt->run(plan, da, db, dc, {}, ws, stream); !s.ok()) {
      cleanup();
      return makeError(s.error());
    }
  }
  cudaEventRecord(stop, stream);
  cudaError_t err = cudaEventSynchronize(stop);
  float ms = 0;
  cudaEventElapsedTime(&ms, start, stop);
  cleanup();
  if (err != cudaSuccess) return makeError("the matmul test failed: ", cudaGetErrorString(err));
  return 2.0 * n * double(n) * n * iters / (ms * 1e-3) / 1e12;
}

// NCCL all-reduce bus bandwidth (GB/s) over all `count` GPUs, 256 MiB of floats, one thread driving all.
Result<double> allReduceBusBandwidth(int count) {
  TPC_ASSIGN(const Nccl* nc, nccl());
  std::vector<ncclComm_t> comms(count);
  if (nc->commInitAll(comms.data(), count, nullptr) != ncclSuccess) return makeError("ncclCommInitAll failed");
  const size_t elems = size_t(64) << 20;
  std::vector<void*> buf(count, nullptr);
  std::vector<cudaStream_t> streams(count);
  for (int i = 0; i < count; ++i) {
    cudaSetDevice(i);
    cudaMalloc(&buf[i], elems * 4);
    cudaMemset(buf[i], 0, elems * 4);
    cudaStreamCreate(&streams[i]);
  }
  auto round = [&] {
    nc->groupStart();
    for (int i = 0; i < count; ++i) nc->allReduce(buf[i], buf[i], elems, ncclFloat, ncclSum, comms[i], streams[i]);
    nc->groupEnd();
    for (int i = 0; i < count; ++i) cudaSetDevice(i), cudaStreamSynchronize(streams[i]);
  };
  round();  // warm-up (connections are set up lazily)
  cudaEvent_t start, stop;
  cudaSetDevice(0);
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  const int iters = 10;
  cudaEventRecord(start, streams[0]);
  for (int k = 0; k < iters; ++k) round();
  cudaSetDevice(0);
  cudaEventRecord(stop, streams[0]);
  cudaEventSynchronize(stop);
  float ms = 0;
  cudaEventElapsedTime(&ms, start, stop);
  for (int i = 0; i < count; ++i) cudaSetDevice(i), cudaFree(buf[i]), cudaStreamDestroy(streams[i]), nc->commDestroy(comms[i]);
  double algbw = double(elems * 4) * iters / (ms * 1e-3) / 1e9;
  return algbw * 2.0 * (count - 1) / count;  // nccl-tests' bus bandwidth
}

}  // namespace

int runDoctor(std::ostream& out, int matmulSize) {
  int warnings = 0;
  auto warn = [&](const std::string& w) {
    out << "  warning: " << w << "\n";
    ++warnings;
  };
  int driver = 0, runtime = 0;
  cudaDriverGetVersion(&driver);
  cudaRuntimeGetVersion(&runtime);
  out << "CUDA runtime " << versionOf(runtime) << " (linked into tpc); driver supports CUDA "
      << (driver ? versionOf(driver) : std::string("none")) << "\n";
  std::string why;
  auto devices = listDevices(&why);
  if (devices.empty()) {
    warn("no GPU: " + why + "; tpc trains on the CPU backend");
    return warnings;
  }
  for (const DeviceInfo& d : devices)
    out << "GPU " << d.index << ": " << d.name << " (sm_" << d.major << d.minor << ", " << (d.totalMemory >> 30)
        << " GiB)\n";
  if (driver < runtime) warn("the driver is older than the CUDA runtime tpc was built with; update the driver");
  if (auto nv = nvrtc(); nv.ok()) {
    int major = 0, minor = 0;
    (*nv)->version(&major, &minor);
    out << "NVRTC " << major << "." << minor << "\n";
  } else {
    warn((nv.error()));
  }
  if (auto lt = cublasLt(); lt.ok()) {
    size_t v = (*lt)->getVersion();
    out << "cuBLASLt " << v / 10000 << "." << (v / 100) % 100 << "." << v % 100 << "\n";
  } else {
    warn(lt.error());
  }
  if (auto dnn = cudnn(); dnn.ok()) {
    size_t v = (*dnn)->getVersion();
    out << "cuDNN " << v / 10000 << "." << (v / 100) % 100 << "." << v % 100 << " (fused attention)\n";
  } else {
    out << "cuDNN: not found (" << dnn.error() << "); attention runs on tpc's kernels, slower\n";
  }
  if (auto nc = nccl(); nc.ok()) {
    int v = 0;
    (*nc)->getVersion(&v);
    int major = v / 10000, minor = (v / 100) % 100;
    out << "NCCL " << major << "." << minor << "." << v % 100 << "\n";
    if (major < 2 || (major == 2 && minor < 18)) warn("NCCL older than 2.18: update it (pip install nvidia-nccl-cu13)");
  } else {
    out << "NCCL: not found (" << nc.error() << ")\n";
    if (devices.size() > 1) warn("NCCL is needed for tensor parallelism across GPUs");
  }
  // Topology: peer access (NVLink or PCIe P2P) between every pair; tp ranks need it.
  if (devices.size() > 1) {
    out << "peer access (P2P performance rank, lower is faster):\n";
    for (size_t i = 0; i < devices.size(); ++i) {
      out << "  GPU " << i << ":";
      for (size_t j = 0; j < devices.size(); ++j) {
        if (i == j) {
          out << "   -";
          continue;
        }
        int can = 0, rank = -1;
        cudaDeviceCanAccessPeer(&can, int(i), int(j));
        if (can) cudaDeviceGetP2PAttribute(&rank, cudaDevP2PAttrPerformanceRank, int(i), int(j));
        char cell[16];
        std::snprintf(cell, sizeof cell, can ? "%4d" : "  no", rank);
        out << cell;
        if (!can && i < j)
          warn("no peer access between GPU " + std::to_string(i) + " and GPU " + std::to_string(j) +
               ": tensor-parallel ranks there talk through host memory; keep tp within GPUs that have it");
      }
      out << "\n";
    }
  } else {
    out << "topology: one GPU (tp > 1 runs on virtual ranks, collectives as device copies)\n";
  }
  auto rate = matmulRate(0, matmulSize);
  if (rate.ok()) {
    // The peak tpc run's MFU divides by for this GPU (the table's, or the H200's when the GPU is not in it).
    const PeakFlops peak = peakFlopsFor(devices[0].name, "bf16");
    char line[300];
    std::snprintf(line, sizeof line,
                  "bf16 matmul %dx%dx%d on GPU 0: %.0f TFLOP/s measured (%.0f%% of the %s peak tpc run's MFU "
                  "divides by)\n",
                  matmulSize, matmulSize, matmulSize, *rate, 100.0 * *rate * 1e12 / peak.flops, peak.label.c_str());
    out << line;
  } else {
    warn("bf16 matmul test: " + rate.error());
  }
  if (devices.size() > 1) {
    auto bw = allReduceBusBandwidth(static_cast<int>(devices.size()));
    if (bw.ok())
      out << "NCCL all-reduce of 256 MiB over " << devices.size() << " GPUs: " << static_cast<int>(*bw)
          << " GB/s bus bandwidth\n";
    else
      warn("all-reduce test: " + bw.error());
  } else {
    out << "all-reduce bandwidth: needs two or more GPUs\n";
  }
  return warnings;
}

}  // namespace tpc::cuda
