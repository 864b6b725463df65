// dlopen of NVRTC, cuBLASLt, NCCL and cuDNN by their CUDA 13 sonames; the driver API through the runtime's entry points.
#include "runtime/cuda/cuda_libraries.h"

#include <dlfcn.h>

#include <cuda_runtime_api.h>

#include <glob.h>

#include <mutex>

namespace tpc::cuda {
namespace {

struct Opened {
  void* handle = nullptr;
  std::string error;
};

Opened openFirst(std::initializer_list<const char*> names, const char* what) {
  Opened o;
  std::string tried;
  for (const char* n : names) {
    o.handle = dlopen(n, RTLD_NOW | RTLD_LOCAL);
    if (o.handle) return o;
    tried += std::string(tried.empty() ? "" : ", ") + n;
  }
  o.error = cat("cannot load ", what, " (tried ", tried, "; install the CUDA 13 toolkit or "
                "pip install nvidia-cuda-nvrtc / nvidia-cublas, and add its lib folder to LD_LIBRARY_PATH)");
  return o;
}

template <class F>
bool sym(void* h, const char* name, F& out, std::string& err) {
  out = reinterpret_cast<F>(dlsym(h, name));
  if (!out && err.empty()) err = cat("symbol ", name, " missing");
  return out != nullptr;
}

// `soname` from the library path, else from the first Python site-packages folder whose pip wheel
// (nvidia-<wheel>-cu13) holds it under nvidia/<wheel>/lib; nullptr when neither loads.
void* openSonameOrWheel(const char* soname, const char* wheel) {
  if (void* h = dlopen(soname, RTLD_NOW | RTLD_LOCAL)) return h;
  for (const char* root : {"/usr/local/lib/python3*/dist-packages", "/usr/lib/python3*/dist-packages",
                           "/usr/local/lib/python3*/site-packages", "/root/.local/lib/python3*/site-packages",
                           "/opt/*/.venv/lib/python3*/site-packages", "/opt/*/lib/python3*/site-packages"}) {
    std::string pattern = cat(root, "/nvidia/", wheel, "/lib/", soname);
    glob_t g{};
    void* h = nullptr;
    if (glob(pattern.c_str(), 0, nullptr, &g) == 0 && g.gl_pathc > 0) h = dlopen(g.gl_pathv[0], RTLD_NOW | RTLD_LOCAL);
    globfree(&g);
    if (h) return h;
  }
  return nullptr;
}

}  // namespace

Result<const Nvrtc*> nvrtc() {
  static Nvrtc lib;
  static std::string error;
  static std::once_flag once;
  std::call_once(once, [] {
    Opened o = openFirst({"libnvrtc.so.13", "libnvrtc.so"}, "NVRTC (libnvrtc.so.13, the CUDA kernel compiler)");
    if (!o.handle) { error = o.error; return; }
    std::string e;
    sym(o.handle, "nvrtcVersion", lib.version, e);
    sym(o.handle, "nvrtcGetErrorString", lib.getErrorString, e);
    sym(o.handle, "nvrtcCreateProgram", lib.createProgram, e);
    sym(o.handle, "nvrtcCompileProgram", lib.compileProgram, e);
    sym(o.handle, "nvrtcGetProgramLogSize", lib.getProgramLogSize, e);
    sym(o.handle, "nvrtcGetProgramLog", lib.getProgramLog, e);
    sym(o.handle, "nvrtcGetCUBINSize", lib.getCUBINSize, e);
    sym(o.handle, "nvrtcGetCUBIN", lib.getCUBIN, e);
    sym(o.handle, "nvrtcDestroyProgram", lib.destroyProgram, e);
    if (!e.empty()) error = cat("libnvrtc.so.13: ", e, " (an NVRTC older than CUDA 13?)");
  });
  if (!error.empty()) return makeError(error);
  return &lib;
}

Result<const CublasLt*> cublasLt() {
  static CublasLt lib;
  static std::string error;
  static std::once_flag once;
  std::call_once(once, [] {
    Opened o = openFirst({"libcublasLt.so.13", "libcublasLt.so"}, "cuBLASLt (libcublasLt.so.13, used for matmuls)");
    if (!o.handle) { error = o.error; return; }
    std::string e;
    sym(o.handle, "cublasLtCreate", lib.create, e);
    sym(o.handle, "cublasLtMatmulDescCreate", lib.matmulDescCreate, e);
    sym(o.handle, "cublasLtMatmulDescDestroy", lib.matmulDescDestroy, e);
    sym(o.handle, "cublasLtMatmulDescSetAttribute", lib.matmulDescSetAttribute, e);
    sym(o.handle, "cublasLtMatrixLayoutCreate", lib.matrixLayoutCreate, e);
    sym(o.handle, "cublasLtMatrixLayoutDestroy", lib.matrixLayoutDestroy, e);
    sym(o.handle, "cublasLtMatrixLayoutSetAttribute", lib.matrixLayoutSetAttribute, e);
    sym(o.handle, "cublasLtMatmulPreferenceCreate", lib.preferenceCreate, e);
    sym(o.handle, "cublasLtMatmulPreferenceDestroy", lib.preferenceDestroy, e);
    sym(o.handle, "cublasLtMatmulPreferenceSetAttribute", lib.preferenceSetAttribute, e);
    sym(o.handle, "cublasLtMatmulAlgoGetHeuristic", lib.algoGetHeuristic, e);
    sym(o.handle, "cublasLtMatmul", lib.matmul, e);
    sym(o.handle, "cublasLtGetVersion", lib.getVersion, e);
    if (!e.empty()) error = cat("libcublasLt.so.13: ", e);
  });
  if (!error.empty()) return makeError(error);
  return &lib;
}

Result<const Driver*> driver() {
  static Driver lib;
  static std::string error;
  static std::once_flag once;
  std::call_once(once, [] {
    auto get = [](const char* name, auto& out) {
      void* fn = nullptr;
      cudaDriverEntryPointQueryResult q{};
      cudaError_t err = cudaGetDriverEntryPointByVersion(name, &fn, 12000, cudaEnableDefault, &q);
      if (err != cudaSuccess || q != cudaDriverEntryPointSuccess || !fn) {
        if (error.empty()) error = cat("the CUDA driver has no ", name, " (", cudaGetErrorString(err), "; update the driver)");
        return;
      }
      out = reinterpret_cast<std::remove_reference_t<decltype(out)>>(fn);
    };
    get("cuModuleLoadData", lib.moduleLoadData);
    get("cuModuleGetFunction", lib.moduleGetFunction);
    get("cuFuncSetAttribute", lib.funcSetAttribute);
    get("cuFuncGetAttribute", lib.funcGetAttribute);
    get("cuLaunchKernel", lib.launchKernel);
    get("cuGetErrorString", lib.getErrorString);
    get("cuTensorMapEncodeTiled", lib.tensorMapEncodeTiled);
    get("cuOccupancyMaxActiveClusters", lib.occupancyMaxActiveClusters);
  });
  if (!error.empty()) return makeError(error);
  return &lib;
}

Result<const Nccl*> nccl() {
  static Nccl lib;
  static std::string error;
  static std::once_flag once;
  std::call_once(once, [] {
    void* h = openSonameOrWheel("libnccl.so.2", "nccl");
    if (!h) {
      error = "cannot load NCCL (libnccl.so.2, for collectives between GPUs): install it (apt libnccl2, or pip install "
              "nvidia-nccl-cu13) and add its lib folder to LD_LIBRARY_PATH";
      return;
    }
    std::string e;
    sym(h, "ncclGetErrorString", lib.getErrorString, e);
    sym(h, "ncclCommInitAll", lib.commInitAll, e);
    sym(h, "ncclGetUniqueId", lib.getUniqueId, e);
    sym(h, "ncclCommInitRank", lib.commInitRank, e);
    sym(h, "ncclCommDestroy", lib.commDestroy, e);
    sym(h, "ncclCommAbort", lib.commAbort, e);
    sym(h, "ncclAllReduce", lib.allReduce, e);
    sym(h, "ncclAllGather", lib.allGather, e);
    sym(h, "ncclGetVersion", lib.getVersion, e);
    sym(h, "ncclReduceScatter", lib.reduceScatter, e);
    sym(h, "ncclGroupStart", lib.groupStart, e);
    sym(h, "ncclGroupEnd", lib.groupEnd, e);
    if (!e.empty()) error = cat("libnccl.so.2: ", e);
  });
  if (!error.empty()) return makeError(error);
  return &lib;
}

Result<const Cudnn*> cudnn() {
  static Cudnn lib;
  static std::string error;
  static std::once_flag once;
  std::call_once(once, [] {
    void* h = openSonameOrWheel("libcudnn.so.9", "cudnn");
    if (!h) {
      error = "cannot load cuDNN (libcudnn.so.9, for fused attention): install it (apt libcudnn9-cuda-13, or pip install "
              "nvidia-cudnn-cu13) and add its lib folder to LD_LIBRARY_PATH, or set TPC_ATTENTION=tpc";
      return;
    }
    std::string e;
    sym(h, "cudnnGetVersion", lib.getVersion, e);
    sym(h, "cudnnGetErrorString", lib.getErrorString, e);
    sym(h, "cudnnGetLastErrorString", lib.getLastErrorString, e);
    sym(h, "cudnnCreate", lib.create, e);
    sym(h, "cudnnDestroy", lib.destroy, e);
    sym(h, "cudnnSetStream", lib.setStream, e);
    sym(h, "cudnnBackendCreateDescriptor", lib.createDescriptor, e);
    sym(h, "cudnnBackendDestroyDescriptor", lib.destroyDescriptor, e);
    sym(h, "cudnnBackendSetAttribute", lib.setAttribute, e);
    sym(h, "cudnnBackendGetAttribute", lib.getAttribute, e);
    sym(h, "cudnnBackendFinalize", lib.finalize, e);
    sym(h, "cudnnBackendExecute", lib.execute, e);
    if (!e.empty()) error = cat("libcudnn.so.9: ", e, " (a cuDNN older than 9? update it, or set TPC_ATTENTION=tpc)");
  });
  if (!error.empty()) return makeError(error);
  return &lib;
}

}  // namespace tpc::cuda
