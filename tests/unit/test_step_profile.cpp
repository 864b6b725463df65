// `tpc run --profile-step`: the table of a profiled step (runtime/cuda/step_profile.h), its CSV
// (`--profile-csv`), and the flags' refusals without the CUDA backend, a profiled step or a writable file.
// The timing itself needs a GPU (scripts/gpu_check.sh runs it).
#ifdef TPC_HAVE_CUDA
#include <catch2/catch.hpp>

#include <filesystem>

#include "runtime/cuda/step_profile.h"
#include "test_support.h"

namespace tpc {
namespace {

using namespace cuda;

TEST_CASE("step profile: launches are summed per op, slowest op first, with shares and the slowest launches", "[cuda][profile]") {
  std::vector<TimedLaunch> l = {{"add", "add -> %1 [k]", 1.0},
                                {"matmul", "matmul -> %2", 6.0},
                                {"add", "rank 1: add -> %3 [k]", 2.0},
                                {"gelu", "gelu -> %4 [g]", 1.0}};
  std::string t = formatStepProfile(l, 7, 12.5, 2);
  INFO(t);
  CHECK(t.find("profile of step 7: 4 launches, 10.00 ms") != std::string::npos);
  CHECK(t.find("12.50 ms as one CUDA graph replay") != std::string::npos);
  size_t mm = t.find("  matmul "), add = t.find("  add "), gelu = t.find("  gelu ");
  REQUIRE(mm != std::string::npos);
  REQUIRE(add != std::string::npos);
  REQUIRE(gelu != std::string::npos);
  CHECK(mm < add);
  CHECK(add < gelu);
  CHECK(t.find("60.0%") != std::string::npos);  // matmul: 6 of 10 ms
  CHECK(t.find("30.0%") != std::string::npos);  // add: 2 launches, 3 ms
  CHECK(t.find("the 2 slowest launches") != std::string::npos);
  CHECK(t.find("6.000 ms  matmul -> %2") != std::string::npos);
  CHECK(t.find("gelu -> %4") == t.rfind("gelu -> %4"));  // not among the 2 slowest: listed once, in no top line
}

TEST_CASE("step profile: the GEMMs are summed per shape with their TFLOP/s, slowest first", "[cuda][profile]") {
  // 2 launches of a 2 TFLOP GEMM in 4 ms: 1000 TFLOP/s; one 0.5 TFLOP GEMM in 1 ms: 500 TFLOP/s.
  std::vector<TimedLaunch> l = {{"matmul", "matmul -> %1", 2.0, "matmul bf16[4,8] x bf16[8,16]", 2e12},
                                {"add", "add -> %2 [k]", 3.0},
                                {"matmul_epilogue", "matmul_epilogue -> %3", 1.0, "matmul bf16[4,8] x bf16[8,2] with epilogue bias", 5e11},
                                {"matmul", "matmul -> %4", 2.0, "matmul bf16[4,8] x bf16[8,16]", 2e12}};
  std::string t = formatStepProfile(l, 3, 0, 0);
  INFO(t);
  size_t head = t.find("GEMMs (cuBLASLt) and fused attention (cuDNN), by time:");
  REQUIRE(head != std::string::npos);
  size_t big = t.find("        2      4.000 ms  1000.0 TFLOP/s  matmul bf16[4,8] x bf16[8,16]\n");
  size_t small = t.find("        1      1.000 ms   500.0 TFLOP/s  matmul bf16[4,8] x bf16[8,2] with epilogue bias\n");
  REQUIRE(big != std::string::npos);
  REQUIRE(small != std::string::npos);
  CHECK(head < big);
  CHECK(big < small);
  CHECK(t.find("add -> %2") == std::string::npos);  // top 0: no slowest-launch lines; add is no GEMM
  CHECK(formatStepProfile({{"add", "add -> %1", 1.0}}, 1, 0, 0).find("GEMMs") == std::string::npos);
}

TEST_CASE("step profile: --profile-step on the CPU backend is refused naming the flag", "[cuda][profile][cli]") {
  auto r = test::runCommand(test::tpcBinary() + " run " + test::binaryPath("models/tiny.fb") +
                            " --backend cpu --profile-step 2 --train-iters 2");
  CHECK(r.exitCode == 1);
  CHECK(r.err.find("--profile-step") != std::string::npos);
  CHECK(r.err.find("CUDA backend") != std::string::npos);
  CHECK(r.out.find("step") == std::string::npos);  // refused before training
}

TEST_CASE("step profile: the CSV has every launch in order per GPU, TFLOP/s for GEMMs only, commas quoted",
          "[cuda][profile]") {
  std::vector<TimedLaunch> gpu0 = {{"matmul", "matmul -> %1", 2.0, "matmul bf16[4,8] x bf16[8,16]", 2e12},
                                   {"add", "add -> %2 [k]", 0.5, "", 0},
                                   {"fusion_group=3", "say \"hi\", twice", 0.25, "", 0}};
  std::vector<TimedLaunch> gpu1 = {{"add", "rank 1: add -> %2 [k]", 0.75, "", 0}};
  std::string csv = formatStepProfileCsv({{0, gpu0}, {1, gpu1}});
  INFO(csv);
  CHECK(csv == "gpu,launch,op,ms,tflops,what,gemm\n"
               "0,0,matmul,2.000000,1000.0,matmul -> %1,\"matmul bf16[4,8] x bf16[8,16]\"\n"
               "0,1,add,0.500000,,add -> %2 [k],\n"
               "0,2,fusion_group=3,0.250000,,\"say \"\"hi\"\", twice\",\n"
               "1,0,add,0.750000,,rank 1: add -> %2 [k],\n");
  CHECK(formatStepProfileCsv({}) == "gpu,launch,op,ms,tflops,what,gemm\n");
}

TEST_CASE("step profile: --profile-csv without --profile-step, or where it cannot write, and a --profile-step after "
          "the last step are refused before training",
          "[cuda][profile][cli]") {
  test::TempDir dir;
  const std::string run = test::tpcBinary() + " run " + test::binaryPath("models/tiny.fb") + " --train-iters 2";
  auto alone = test::runCommand(run + " --profile-csv " + (dir.path / "p.csv").string());
  CHECK(alone.exitCode == 1);
  CHECK(alone.err.find("add --profile-step N") != std::string::npos);
  auto missing = test::runCommand(run + " --profile-step 2 --profile-csv " + (dir.path / "no" / "p.csv").string());
  CHECK(missing.exitCode == 1);
  CHECK(missing.err.find("--profile-csv " + (dir.path / "no" / "p.csv").string()) != std::string::npos);
  CHECK(missing.err.find("does not exist; create it first") != std::string::npos);
  auto folder = test::runCommand(run + " --profile-step 2 --profile-csv " + dir.path.string());
  CHECK(folder.exitCode == 1);
  CHECK(folder.err.find("is a directory; name a file to write, not a folder") != std::string::npos);
  auto empty = test::runCommand(run + " --profile-step 2 --profile-csv ''");
  CHECK(empty.exitCode == 1);
  auto late = test::runCommand(run + " --profile-step 3");
  CHECK(late.exitCode == 1);
  CHECK(late.err.find("--profile-step 3 is after the run's last step (--train-iters 2)") != std::string::npos);
  for (const auto* r : {&alone, &missing, &folder, &empty, &late}) CHECK(r->out.find("step ") == std::string::npos);
  CHECK(std::filesystem::is_empty(dir.path));  // nothing half-written
}

}  // namespace
}  // namespace tpc
#endif
