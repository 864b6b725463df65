// Multi-tensor kernels: the chunk map and address table they share (multi_tensor.h), and the multi-tensor
// cast of a cast group (cast_groups.h).
#include "runtime/cuda/kernels/multi_tensor.h"

#include <algorithm>

#include "runtime/cuda/cast_groups.h"
#include "runtime/cuda/kernels/device_prelude.h"
#include "runtime/cuda/kernels/family_lowerings.h"
#include "runtime/cuda/kernels/kernel_source.h"

namespace tpc::cuda {

namespace {

std::string i64List(const std::vector<int64_t>& v) {
  std::string s;
  for (size_t k = 0; k < v.size(); ++k) s += (k ? ", " : "") + i64Lit(v[k]);
  return s;
}

std::vector<int64_t> firstChunks(const std::vector<int64_t>& numel, int64_t chunk) {
  std::vector<int64_t> first{0};
  for (int64_t n : numel) first.push_back(first.back() + (n + chunk - 1) / chunk);
  return first;
}

}  // namespace

int64_t multiTensorChunkCount(const std::vector<int64_t>& numel, int64_t chunk) { return firstChunks(numel, chunk).back(); }

std::string multiTensorChunks(const std::vector<int64_t>& numel, int64_t chunk) {
  return cat(R"(
#define NT )", numel.size(), R"(
#define CHUNK )", chunk, R"(
__device__ const i64 tpc_first[NT + 1] = {)", i64List(firstChunks(numel, chunk)), R"(};
__device__ const i64 tpc_numel[NT] = {)", i64List(numel), R"(};
// The last tensor whose first chunk is at or before chunk c (an empty tensor owns no chunk).
__device__ __forceinline__ int tpc_tensor_of(i64 c) {
  int lo = 0, hi = NT - 1;
  while (lo < hi) {
    int mid = (lo + hi + 1) / 2;
    if (tpc_first[mid] <= c) lo = mid; else hi = mid - 1;
  }
  return lo;
}
)");
}

std::vector<KernelArg> multiTensorAddressTable(int64_t tensors, int64_t operands, int64_t results) {
  std::vector<KernelArg> table;
  for (int64_t t = 0; t < tensors; ++t) {
    for (int64_t j = 0; j < operands; ++j) table.push_back(operandArg(operands * t + j));
    for (int64_t j = 0; j < results; ++j) table.push_back(resultArg(results * t + j));
  }
  return table;
}

// A fixed grid striding over the chunks of all the tensors (so that a few large tensors and many small ones
// spread alike over the GPU); per chunk, eight elements at a time through 16-byte loads and stores when both
// buffers are 16-byte aligned (a chunk starts at a multiple of CHUNK, itself a multiple of 8), else and for
// the chunk's tail one element at a time. Each element goes through float as the cast kernel's does
// (every f32/bf16/f16 value is exact in float), so the bits are the per-node casts'.
// Tensors `kept[t]` have a copy the AdamW kernels keep (adamw_groups.h): while the fresh word is set, their
// results already hold these bits and their chunks are skipped; a group of only such tensors does nothing.
Result<NodeLowering> lowerCastGroup(const FusionGroup& g, const LoweringContext& ctx, int64_t maxBlocks,
                                    const std::vector<bool>& kept) {
  constexpr int64_t kChunk = 8192;
  if (!isCastGroup(g) || g.inputs.size() != g.outputs.size() || g.inputs.size() != 1 + g.absorbed.size())
    return makeError("cast group: not a group of cast nodes in cast_groups.h's layout");
  const Node& n0 = *g.members.front();
  const DType from = g.inputs[0]->dtype(), to = g.outputs[0]->dtype();
  TPC_TRY(checkFloatDType(n0, from, "its operand"));
  TPC_TRY(checkFloatDType(n0, to, "its result"));
  std::vector<int64_t> numel;
  for (size_t t = 0; t < g.inputs.size(); ++t) {
    if (g.inputs[t]->dtype() != from || g.outputs[t]->dtype() != to || g.inputs[t]->type().numel() != g.outputs[t]->type().numel())
      return makeError("cast group: tensor ", t, " is not a ", dtypeName(from), " -> ", dtypeName(to), " cast of the group");
    numel.push_back(g.inputs[t]->type().numel());
  }
  if (!kept.empty() && kept.size() != numel.size()) return makeError("cast group: ", kept.size(), " kept flags for ", numel.size(), " tensors");
  const bool anyKept = std::find(kept.begin(), kept.end(), true) != kept.end();
  const bool allKept = anyKept && std::find(kept.begin(), kept.end(), false) == kept.end();
  const int64_t chunks = multiTensorChunkCount(numel, kChunk);
  std::string src = devicePrelude() + accessors("x", from) + vectorAccessors("x", from) + accessors("y", to) +
                    vectorAccessors("y", to) + multiTensorChunks(numel, kChunk);
  if (anyKept) {
    std::string flags;
    for (size_t t = 0; t < kept.size(); ++t) flags += cat(t ? ", " : "", kept[t] ? 1 : 0);
    src += cat("__device__ const unsigned char tpc_kept[NT] = {", flags, "};\n");
  }
  src += cat(R"(
extern "C" __global__ void tpc_cast_multi(const u64* table)", anyKept ? ", const int* fresh" : "", R"() {)",
             anyKept ? cat(R"(
  const bool skipKept = fresh[0] != 0;)", allKept ? R"(
  if (skipKept) return;)" : "") : "", R"(
  for (i64 c = blockIdx.x; c < tpc_first[NT]; c += gridDim.x) {
    const int k = tpc_tensor_of(c);)", anyKept ? R"(
    if (skipKept && tpc_kept[k]) continue;)" : "");
  src += R"(
    const i64 begin = (c - tpc_first[k]) * CHUNK;
    const i64 end = begin + CHUNK < tpc_numel[k] ? begin + CHUNK : tpc_numel[k];
    const x_t* X = (const x_t*)table[2 * k];
    y_t* Y = (y_t*)table[2 * k + 1];
    i64 tail = begin;
    if (((table[2 * k] | table[2 * k + 1]) & 15) == 0) {
      for (i64 i = begin + 8 * (i64)threadIdx.x; i + 8 <= end; i += 8 * (i64)blockDim.x) {
        float v[8];
        x_ld8(X, i, v);
        y_st8(Y, i, v);
      }
      tail = begin + (end - begin) / 8 * 8;
    }
    for (i64 i = tail + threadIdx.x; i < end; i += blockDim.x) y_st(Y, i, x_ld(X, i));
  }
}
)";
  KernelSpec k;
  k.entry = "tpc_cast_multi";
  k.source = std::move(src);
  k.block.x = 256;
  k.grid.x = static_cast<uint32_t>(std::clamp<int64_t>(chunks, 1, std::max<int64_t>(maxBlocks, 1)));
  k.tables.push_back(multiTensorAddressTable(static_cast<int64_t>(numel.size()), 1, 1));
  k.args.push_back(KernelArg{ArgKind::Table, 0});
  if (anyKept) k.args.push_back(KernelArg{ArgKind::FreshPtr});
  NodeLowering out;
  out.kernels.push_back(std::move(k));
  return out;
}

}  // namespace tpc::cuda
