// Every op's CUDA lowering against the CPU backend on random inputs (forward and backward ops alike:
// the backward of every op is itself an op of ops.def): fp32 within 1e-5 of the largest reference value.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>

#include "cuda_op_cases.h"
#include "gpu_test_support.h"
#include "runtime/cpu/cpu_backend.h"
#include "runtime/cuda/cuda_backend.h"

namespace tpc {

namespace {

// Runs every case (or only the collectives) on the CPU and the GPU; returns the failures. worldGathers: run
// each case as one process of an mpirun job of one (CudaOptions::processRank 0, the job's all-gather a copy
// that counts its calls here).
std::vector<std::string> compareWithCpu(const std::string& collectives, bool onlyCollectives, int& checked,
                                        int* worldGathers = nullptr) {
  std::vector<std::string> failures;
  for (const testing::OpCase& c : testing::cudaOpCases()) {
    if (onlyCollectives && !opInfo(c.op).has(traits::Collective)) continue;
    std::string what = cat(opName(c.op), " ", c.label);
    auto g = testing::buildOpCase(c);
    REQUIRE(g.ok());
    TensorMap inputs = testing::randomInputs(c, **g, 17);
    CpuOptions co;
    co.threads = 1;
    co.seed = 77;
    auto cpu = createCpuBackend(co);
    CudaOptions go;
    go.seed = 77;
    go.verbose = false;
    go.collectives = collectives;
    std::vector<std::unique_ptr<Graph>> rankGraphs;
    if (worldGathers) {
      go.processRank = 0;
      go.allGatherWorld = [worldGathers](const void* in, int64_t bytes, void* out) -> Status {
        ++*worldGathers;
        std::memcpy(out, in, static_cast<size_t>(bytes));
        return {};
      };
      rankGraphs.push_back((*g)->clone());
    }
    auto gpu = createCudaBackend(std::move(rankGraphs), go);
    Status s = cpu->prepare(**g, {});
    REQUIRE(s.ok());
    s = gpu->prepare(**g, {});
    if (!s.ok()) {
      failures.push_back(what + ": prepare: " + s.error());
      continue;
    }
    auto ref = cpu->step(inputs, 5);
    auto got = gpu->step(inputs, 5);
    REQUIRE(ref.ok());
    if (!got.ok()) {
      failures.push_back(what + ": step: " + got.error());
      continue;
    }
    for (auto& [name, r] : *ref) {
      const HostTensor& o = got->at(name);
      if (o.shape() != r.shape()) {
        failures.push_back(cat(what, " ", name, ": shape ", o.type().str(), " vs ", r.type().str()));
        continue;
      }
      double worst = 0, scale = 0;
      for (int64_t i = 0; i < r.numel(); ++i) {
        scale = std::max(scale, std::abs(r.getAsDouble(i)));
        double d = std::abs(o.getAsDouble(i) - r.getAsDouble(i));
        worst = std::isnan(d) ? INFINITY : std::max(worst, d);
      }
      // bf16/f16 results: one rounding step of their type.
      DType t = (*g)->outputs()[0].value->dtype();
      double tol = t == DType::bf16 ? 8e-3 : t == DType::f16 ? 1e-3 : 1e-5;
      if (worst > tol * std::max(scale, 1e-30)) failures.push_back(cat(what, " ", name, ": max |gpu - cpu| ", worst, " vs max |cpu| ", scale));
      ++checked;
    }
  }
  return failures;
}

}  // namespace

TEST_CASE("cuda ops: every op's CUDA lowering matches the CPU backend (fp32 1e-5)", "[gpu]") {
  test::requireGpuOrSkip();
  int checked = 0;
  std::vector<std::string> failures = compareWithCpu("auto", false, checked);
  for (const auto& f : failures) UNSCOPED_INFO(f);
  WARN(checked << " outputs compared, " << failures.size() << " failures");
  CHECK(failures.empty());
}

// NCCL at one rank (only one GPU is lent): the collectives go through a 1-GPU communicator.
TEST_CASE("cuda ops: collectives through NCCL at one rank match the CPU backend", "[gpu]") {
  test::requireGpuOrSkip();
  int checked = 0;
  std::vector<std::string> failures = compareWithCpu("nccl", true, checked);
  for (const auto& f : failures) UNSCOPED_INFO(f);
  WARN(checked << " collective outputs compared through NCCL, " << failures.size() << " failures");
  CHECK(checked == 3);
  CHECK(failures.empty());
}

// One process per rank (mpirun), at one rank: the communicators come from ncclCommInitRank after the job's
// all-gather of the group leaders' ids. (Two ranks need two GPUs: NCCL refuses two ranks on one.)
TEST_CASE("cuda ops: collectives of one process of an mpirun job (ncclCommInitRank) match the CPU backend", "[gpu]") {
  test::requireGpuOrSkip();
  int checked = 0, gathers = 0;
  std::vector<std::string> failures = compareWithCpu("auto", true, checked, &gathers);
  for (const auto& f : failures) UNSCOPED_INFO(f);
  WARN(checked << " collective outputs compared in process mode, " << gathers << " all-gathers over the job, "
               << failures.size() << " failures");
  CHECK(checked == 3);
  CHECK(gathers == 3);  // one per case: the ids of every mesh axis in one exchange
  CHECK(failures.empty());
}

}  // namespace tpc
