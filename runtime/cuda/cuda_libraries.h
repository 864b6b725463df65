// The CUDA libraries tpc uses beyond the (statically linked) runtime, loaded on first use with dlopen so
// that the binary starts, and the CPU backend runs, on machines without them: NVRTC (kernel compiler),
// cuBLASLt (matmuls), NCCL (collectives), cuDNN (fused attention) and the driver's module/launch API (through
// cudaGetDriverEntryPointByVersion, so libcuda is never linked). A missing library is an error naming it and how to get it.
#pragma once

#include <cublasLt.h>
#include <cuda.h>
#include <cudnn_graph.h>
#include <nccl.h>
#include <nvrtc.h>

#include "ir/status.h"

namespace tpc::cuda {

struct Nvrtc {
  decltype(&::nvrtcVersion) version;
  decltype(&::nvrtcGetErrorString) getErrorString;
  decltype(&::nvrtcCreateProgram) createProgram;
  decltype(&::nvrtcCompileProgram) compileProgram;
  decltype(&::nvrtcGetProgramLogSize) getProgramLogSize;
  decltype(&::nvrtcGetProgramLog) getProgramLog;
  decltype(&::nvrtcGetCUBINSize) getCUBINSize;
  decltype(&::nvrtcGetCUBIN) getCUBIN;
  decltype(&::nvrtcDestroyProgram) destroyProgram;
};

struct CublasLt {
  decltype(&::cublasLtCreate) create;
  decltype(&::cublasLtMatmulDescCreate) matmulDescCreate;
  decltype(&::cublasLtMatmulDescDestroy) matmulDescDestroy;
  decltype(&::cublasLtMatmulDescSetAttribute) matmulDescSetAttribute;
  decltype(&::cublasLtMatrixLayoutCreate) matrixLayoutCreate;
  decltype(&::cublasLtMatrixLayoutDestroy) matrixLayoutDestroy;
  decltype(&::cublasLtMatrixLayoutSetAttribute) matrixLayoutSetAttribute;
  decltype(&::cublasLtMatmulPreferenceCreate) preferenceCreate;
  decltype(&::cublasLtMatmulPreferenceDestroy) preferenceDestroy;
  decltype(&::cublasLtMatmulPreferenceSetAttribute) preferenceSetAttribute;
  decltype(&::cublasLtMatmulAlgoGetHeuristic) algoGetHeuristic;
  decltype(&::cublasLtMatmul) matmul;
  decltype(&::cublasLtGetVersion) getVersion;
};

struct Driver {
  decltype(&::cuModuleLoadData) moduleLoadData;
  decltype(&::cuModuleGetFunction) moduleGetFunction;
  decltype(&::cuFuncSetAttribute) funcSetAttribute;
  decltype(&::cuFuncGetAttribute) funcGetAttribute;
  decltype(&::cuLaunchKernel) launchKernel;
  decltype(&::cuGetErrorString) getErrorString;
  decltype(&::cuTensorMapEncodeTiled) tensorMapEncodeTiled;  // TMA descriptors (sm_90 GEMM kernels)
  decltype(&::cuOccupancyMaxActiveClusters) occupancyMaxActiveClusters;  // clustered persistent kernels' grids
};

struct Nccl {
  decltype(&::ncclGetErrorString) getErrorString;
  decltype(&::ncclCommInitAll) commInitAll;
  decltype(&::ncclGetUniqueId) getUniqueId;
  decltype(&::ncclCommInitRank) commInitRank;
  decltype(&::ncclCommDestroy) commDestroy;
  decltype(&::ncclCommAbort) commAbort;
  decltype(&::ncclAllReduce) allReduce;
  decltype(&::ncclAllGather) allGather;
  decltype(&::ncclReduceScatter) reduceScatter;
  decltype(&::ncclGroupStart) groupStart;
  decltype(&::ncclGroupEnd) groupEnd;
  decltype(&::ncclGetVersion) getVersion;
};

// cuDNN's graph (backend) API, for fused attention (runtime/cuda/cudnn_attention.h).
struct Cudnn {
  decltype(&::cudnnGetVersion) getVersion;
  decltype(&::cudnnGetErrorString) getErrorString;
  decltype(&::cudnnGetLastErrorString) getLastErrorString;
  decltype(&::cudnnCreate) create;
  decltype(&::cudnnDestroy) destroy;
  decltype(&::cudnnSetStream) setStream;
  decltype(&::cudnnBackendCreateDescriptor) createDescriptor;
  decltype(&::cudnnBackendDestroyDescriptor) destroyDescriptor;
  decltype(&::cudnnBackendSetAttribute) setAttribute;
  decltype(&::cudnnBackendGetAttribute) getAttribute;
  decltype(&::cudnnBackendFinalize) finalize;
  decltype(&::cudnnBackendExecute) execute;
};

// Loaded once per process; errors are remembered and returned again.
Result<const Nvrtc*> nvrtc();
Result<const CublasLt*> cublasLt();
Result<const Driver*> driver();
// libnccl.so.2 from the library path, else from a pip wheel (nvidia-nccl-cu13: site-packages/nvidia/nccl/lib).
Result<const Nccl*> nccl();
// libcudnn.so.9 from the library path, else from a pip wheel (nvidia-cudnn-cu13: site-packages/nvidia/cudnn/lib).
Result<const Cudnn*> cudnn();

}  // namespace tpc::cuda
