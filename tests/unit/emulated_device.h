// The CPU emulator as a multi-tensor test's Device (adamw_group_cases.h): host memory as device memory,
// kernels compiled by the host compiler (cuda_emulator.h), once per source.
#pragma once

#include <cstring>
#include <map>
#include <memory>
#include <new>

#include "adamw_group_cases.h"
#include "cuda_emulator.h"
#include "test_support.h"

namespace tpc::test {

struct EmulatedDevice final : adamw::Device {
  TempDir dir;
  std::map<std::string, EmuLaunch> built;
  std::vector<std::unique_ptr<char[]>> blocks;
  long long step = 3;
  char* alloc(size_t bytes) override {
    blocks.emplace_back(new (std::align_val_t(16)) char[bytes]);
    return blocks.back().get();
  }
  void upload(char* dst, const void* src, size_t bytes) override { std::memcpy(dst, src, bytes); }
  void download(void* dst, const char* src, size_t bytes) override { std::memcpy(dst, src, bytes); }
  void launch(const cuda::KernelSpec& k, const std::vector<void*>& ops, const std::vector<void*>& res, int hold) override {
    auto it = built.find(k.source);
    if (it == built.end()) {
      auto fn = compileEmulated(k.source, k.entry, dir.path.string(), static_cast<int>(built.size()));
      if (!fn.ok()) FAIL(fn.error());
      it = built.emplace(k.source, *fn).first;
    }
    int holdWord = hold;
    kernels::ArgPack pack(k, ops, res, nullptr, 0, &step, &holdWord, {}, &holdWord);  // hold doubles as the fresh word
    it->second(pack.args.data(), k.grid.x, k.grid.y, k.grid.z, k.block.x, k.block.y, k.block.z, k.sharedBytes);
  }
};

}  // namespace tpc::test
