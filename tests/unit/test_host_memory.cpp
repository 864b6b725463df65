// The CPU backends refuse, in prepare(), a step whose parameters, batch and peak activations need more host
// memory than the machine has (runtime/memory_estimate.h): one error naming the parts and the flags to
// change, before anything is allocated, on one rank and summed over the ranks of a mesh; `tpc run` exits 1
// with it before any step.
#include <catch2/catch.hpp>

#include <cstdlib>

#include "gpt_step_support.h"
#include "runtime/cpu/cpu_backend.h"
#include "runtime/cpu/cpu_mesh_backend.h"
#include "runtime/memory_estimate.h"
#include "test_support.h"

namespace tpc {

TEST_CASE("host memory: the estimate counts float values at the CPU backend's width", "[cpu][memory]") {
  auto bf = test::gptStep(test::smallGpt(), 2, "mixed-precision(dtype=bf16)," + test::kTrainPasses);
  MemoryEstimate own = estimateMemory(*bf), f32 = estimateMemory(*bf, 4), f64 = estimateMemory(*bf, 8);
  CHECK(own.peakActivationBytes > 0);
  CHECK(f32.peakActivationBytes > own.peakActivationBytes);  // the bf16 activations take 4 bytes on the CPU
  CHECK(f64.peakActivationBytes > f32.peakActivationBytes);
  CHECK(f64.stateBytes == 2 * f32.stateBytes);               // every parameter and moment is a float
  CHECK(f32.inputBytes == own.inputBytes);                   // tokens and targets are integers; lr and step f32
  CHECK(availableHostMemory() > 0);                          // Linux: /proc/meminfo (or a cgroup's limit)
}

TEST_CASE("host memory: the CPU backend refuses a step larger than its limit, naming the parts and the flags",
          "[cpu][memory]") {
  auto g = test::gptStep(test::smallGpt(), 2, test::kTrainPasses);
  MemoryEstimate need = estimateMemory(*g, 4);
  for (int64_t limit : {need.total() - 1, need.total(), int64_t(-1)}) {
    INFO("limit " << limit << " of " << need.total());
    CpuOptions o;
    o.hostMemoryLimit = limit;
    Status st = createCpuBackend(o)->prepare(*g, test::initialState(*g, 3));
    if (limit == need.total() - 1) {
      REQUIRE_FALSE(st.ok());
      CHECK(st.error().find("cpu backend: one training step needs about " + formatBytes(need.total())) != std::string::npos);
      CHECK(st.error().find("activations " + formatBytes(need.peakActivationBytes)) != std::string::npos);
      CHECK(st.error().find("parameters and optimizer state " + formatBytes(need.stateBytes)) != std::string::npos);
      CHECK(st.error().find("available: lower --micro-batch-size or --seq-length") != std::string::npos);
    } else {
      CHECK(st.ok());
    }
  }
}

TEST_CASE("host memory: the CPU mesh backend sums the ranks it runs", "[cpu][memory]") {
  GptConfig c = test::smallGpt();
  c.heads = 4;
  auto g = test::gptStep(c, 2, test::megatronTp(2) + test::kTrainPasses);
  auto ranks = test::rankGraphs(*g);
  REQUIRE(ranks.size() == 2);
  int64_t both = 0;
  for (const auto& r : ranks) both += estimateMemory(*r, 4).total();
  for (int64_t limit : {both - 1, both}) {
    CpuOptions o;
    o.hostMemoryLimit = limit;
    Status st = createCpuMeshBackend(test::rankGraphs(*g), o)->prepare(*g, test::initialState(*g, 3));
    INFO((st.ok() ? std::string() : st.error()));
    CHECK(st.ok() == (limit == both));
    if (!st.ok()) CHECK(st.error().find("for the 2 ranks of this process") != std::string::npos);
  }
}

TEST_CASE("host memory: the limit is the option, else what is available, else none under TPC_HOST_MEMORY_CHECK=0",
          "[cpu][memory]") {
  const char* saved = std::getenv("TPC_HOST_MEMORY_CHECK");
  std::string keep = saved ? saved : "";
  unsetenv("TPC_HOST_MEMORY_CHECK");
  CHECK(hostMemoryLimit(12345) == 12345);
  CHECK(hostMemoryLimit(0) > 0);
  setenv("TPC_HOST_MEMORY_CHECK", "0", 1);
  CHECK(hostMemoryLimit(0) == -1);
  CHECK(hostMemoryLimit(12345) == 12345);
  if (saved) setenv("TPC_HOST_MEMORY_CHECK", keep.c_str(), 1);
  else unsetenv("TPC_HOST_MEMORY_CHECK");
  CHECK(checkHostMemory(MemoryEstimate{1, 2, 3, nullptr}, -1, "x").ok());  // no limit known: no check
  CHECK(checkHostMemory(MemoryEstimate{1, 2, 3, nullptr}, 6, "x").ok());
  Status over = checkHostMemory(MemoryEstimate{1, 2, 3, nullptr}, 5, "x");
  REQUIRE_FALSE(over.ok());
  CHECK(over.error().find("TPC_HOST_MEMORY_CHECK=0 skips this check") != std::string::npos);
}

TEST_CASE("host memory: tpc run on the CPU with a batch no machine holds exits 1 before any step", "[cpu][memory][cli]") {
  // tiny.fb at a micro batch of a million windows of 64 tokens: about 1.4 TiB of activations in f32.
  auto r = test::runCommand(test::tpcBinary() + " run " + test::binaryPath("models/tiny.fb") +
                            " --backend cpu --micro-batch-size 1000000 --train-iters 1");
  CHECK(r.exitCode == 1);
  CHECK(r.err.find("cpu backend: one training step needs about") != std::string::npos);
  CHECK(r.err.find("--micro-batch-size") != std::string::npos);
  CHECK(r.out.find("step ") == std::string::npos);
}

}  // namespace tpc
