// attention / attention_qkv and their gradients through cuDNN's fused flash attention, built with cuDNN's
// graph (backend) API: the operation graphs the cudnn-frontend's SDPA nodes build (matmul, scale, causal
// mask, softmax with stats, matmul; and the backward's), finalized into an execution plan once per shape and
// run with a variant pack bound to the node's buffers. cuDNN's stats are the same natural-log lse of the
// scaled scores that our kernels keep, so either backward reads either forward's lse.
//
// Taken where `cudnnAttentionTakes` holds (16-bit q/k/v, head_dim a multiple of 8 up to 128, Tq == Tk, no
// dropout, 16-byte aligned rows, and for the backward T % 128 == 0); TPC_ATTENTION=tpc keeps our tensor-core
// kernels (runtime/cuda/kernels/attention*.cpp), which also run everything else.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include <cuda_runtime_api.h>

#include "ir/graph.h"
#include "ir/status.h"
#include "runtime/cuda/candidate_timing.h"
#include "runtime/cuda/kernels/attention.h"

namespace tpc::cuda {

bool cudnnAttentionEligible(const AttnShape& a);
// Whether `n` is attention, attention_qkv or a gradient of them of an eligible shape.
bool cudnnAttentionTakes(const Node& n);

class CudnnAttention {
 public:
  // Loads cuDNN and creates a handle on the current device. deterministic: the backward graph the frontend
  // builds in its deterministic mode (dQ written by the last matmul, the reductions deterministic), so that a
  // step gives the same bits every time; false: dQ accumulated in an f32 workspace, which cuDNN's engine may
  // sum in any order.
  // autotune: per distinct plan, time each distinct engine config of cuDNN's heuristics (up to 8) on scratch
  // buffers and keep the fastest, remembered by this process and in the cache folder (disk_cache.h) under
  // the GPU, cuDNN's version and the plan; false: the heuristics' first config that finalizes.
  static Result<std::unique_ptr<CudnnAttention>> create(bool deterministic = true, bool autotune = true,
                                                        CandidateTiming timing = CandidateTiming::Quick);
  ~CudnnAttention();
  // The execution plan of `n`'s shape (built once per distinct op, shape, layout and scale): an error where cuDNN has no engine
  // for it (remembered: the same shape is not tried again). Its id for workspaceBytes, bind and what.
  Result<int> plan(const Node& n);
  // Builds and finalizes n's tensors and operations, what plan() does before asking for engines: needs
  // cuDNN but no GPU (a unit test checks every attribute the graphs set on this machine).
  static Status checkOperations(const Node& n, bool deterministic = true);
  // Device bytes the plan needs besides the node's buffers (the backend's workspace for the node).
  int64_t workspaceBytes(int plan) const;
  // A variant pack for `plan` with the node's operand and result addresses (in the node's order) and its
  // workspace; returns its id for run.
  Result<int> bind(int plan, const std::vector<void*>& operands, const std::vector<void*>& results, void* workspace);
  // Enqueues binding `id` on `stream` (capturable: no allocation, no host synchronisation).
  Status run(int binding, cudaStream_t stream) const;
  // "cuDNN 9.14.0 flash attention bf16 [16,12,1024,64] causal forward" and its FLOPs (as our kernels count them).
  const std::string& what(int plan) const;
  double flops(int plan) const;
  std::string version() const;
  int plans() const { return static_cast<int>(plans_.size()); }
  // The engine config a plan runs ("engine 2, knobs 24=7"), and how many configs this object has timed.
  const std::string& engine(int plan) const;
  int timedConfigs() const { return timed_; }

  struct Plan;
  struct Binding;

 private:
  CudnnAttention() = default;
  static constexpr size_t kMaxCandidates = 8;
  // The plan with its candidate configs: the remembered one when given and it still finalizes, else the
  // first that finalizes, or (autotune_) each distinct one up to kMaxCandidates.
  Result<std::unique_ptr<Plan>> build(const AttnShape& a, bool backward, const std::string* remembered) const;
  Result<size_t> fastestCandidate(const Node& n, Plan& p) const;  // the index of the fastest of p's candidates
  void* handle_ = nullptr;
  bool deterministic_ = true;
  bool autotune_ = true;
  CandidateTiming timing_ = CandidateTiming::Quick;  // how autotune_ times the candidates
  int timed_ = 0;
  std::vector<std::unique_ptr<Plan>> plans_;
  std::map<std::string, int> planOf_;  // the plan of each distinct op, shape, layout and scale
  std::map<std::string, std::string> failed_;  // and why cuDNN has none, for those it refused
  std::vector<std::unique_ptr<Binding>> bindings_;
};

}  // namespace tpc::cuda
