// The GPU as a multi-tensor test's Device (adamw_group_cases.h): cudaMalloc'ed buffers, kernels compiled by
// NVRTC and launched synchronously.
#pragma once

#include <cuda_runtime.h>

#include <catch2/catch.hpp>

#include <algorithm>
#include <vector>

#include "adamw_group_cases.h"
#include "gpu_test_support.h"
#include "runtime/cuda/nvrtc_compiler.h"

namespace tpc::test {

struct GpuDevice final : adamw::Device {
  cuda::NvrtcCompiler nvrtc;
  std::vector<void*> blocks;
  std::vector<cudaLibrary_t> libs;
  long long* step = nullptr;
  int* hold = nullptr;
  explicit GpuDevice(int sm) : nvrtc(sm) {
    CUDA_OK(cudaMalloc(reinterpret_cast<void**>(&step), 8));
    long long s = 3;
    CUDA_OK(cudaMemcpy(step, &s, 8, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMalloc(reinterpret_cast<void**>(&hold), 4));
  }
  ~GpuDevice() override {
    for (void* p : blocks) cudaFree(p);
    for (cudaLibrary_t l : libs) cudaLibraryUnload(l);
    cudaFree(step);
    cudaFree(hold);
  }
  char* alloc(size_t bytes) override {
    void* p = nullptr;
    CUDA_OK(cudaMalloc(&p, bytes));
    blocks.push_back(p);
    return static_cast<char*>(p);
  }
  void upload(char* dst, const void* src, size_t bytes) override {
    CUDA_OK(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice));
  }
  void download(void* dst, const char* src, size_t bytes) override {
    CUDA_OK(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost));
  }
  void launch(const cuda::KernelSpec& k, const std::vector<void*>& ops, const std::vector<void*>& res, int h) override {
    auto cubin = nvrtc.compile(k.source, k.entry);
    if (!cubin.ok()) FAIL(cubin.error());
    cudaLibrary_t lib;
    CUDA_OK(cudaLibraryLoadData(&lib, cubin->data(), nullptr, nullptr, 0, nullptr, nullptr, 0));
    libs.push_back(lib);
    cudaKernel_t kern;
    CUDA_OK(cudaLibraryGetKernel(&kern, lib, k.entry.c_str()));
    CUDA_OK(cudaMemcpy(hold, &h, 4, cudaMemcpyHostToDevice));
    kernels::ArgPack pack(k, ops, res, nullptr, 0, step, hold, [&](const std::vector<uint64_t>& a) -> void* {
      char* t = alloc(std::max<size_t>(a.size(), 1) * 8);
      upload(t, a.data(), a.size() * 8);
      return t;
    }, hold);  // hold doubles as the fresh word (no kernel reads both)
    CUDA_OK(cudaLaunchKernel(reinterpret_cast<const void*>(kern), dim3(k.grid.x, k.grid.y, k.grid.z),
                             dim3(k.block.x, k.block.y, k.block.z), pack.args.data(), k.sharedBytes, 0));
    CUDA_OK(cudaGetLastError());
    CUDA_OK(cudaDeviceSynchronize());
  }
};

}  // namespace tpc::test
