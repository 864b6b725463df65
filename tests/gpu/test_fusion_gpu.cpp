// Fusion on the GPU: a 2-layer GPT trained 10 steps with and without the fuse pass gives the same losses
// (fp32 within 1e-6 relative, dropout on, so fused kernels draw the same Philox masks) with fewer launches.
#include <catch2/catch.hpp>

#include <cmath>
#include <random>

#include "fusion_test_support.h"
#include "gpu_test_support.h"
#include "gpu_train_steps.h"

namespace tpc {

TEST_CASE("cuda fusion: a 2-layer GPT trains 10 steps to the same losses with fewer launches", "[gpu]") {
  test::requireGpuOrSkip();
  for (bool bf16 : {false, true}) {
    test::TenSteps plain = test::trainTenSteps(*test::fusionGptStep(bf16, true, false), CudaOptions{});
    test::TenSteps fused = test::trainTenSteps(*test::fusionGptStep(bf16, true, true), CudaOptions{});
    const double worst = test::worstRelativeDifference(plain.losses, fused.losses);
    WARN((bf16 ? "bf16" : "fp32") << ": losses " << plain.losses.front() << " -> " << plain.losses.back() << "; launches per step "
                                  << plain.launches << " unfused, " << fused.launches
                                  << " fused; worst relative loss difference " << worst);
    // fp32: the fused kernels compute what the unfused ones do (intermediates rounded to their dtype, no FMA
    // contraction), so the bound is tight; bf16 the same, checked looser since cuBLASLt may pick other algorithms.
    CHECK(worst <= (bf16 ? 1e-3 : 1e-6));
    CHECK(fused.launches < plain.launches);
  }
}

// The layer_norm_grad switches for measuring (cuda_backend.cpp): its sums all in shared memory (TPC_LN_GRAD_REGS=0)
// or all in registers (64), rows by the register prefetch or a ring of 3 (TPC_LN_GRAD_STAGES): dx keeps its bits,
// dgamma/dbeta are summed in another order only where the grid differs, so the losses agree to rounding; a bad
// value is one clear error that names it.
TEST_CASE("cuda fusion: the layer_norm_grad switches train a 2-layer GPT to the same losses and reject bad values",
          "[gpu]") {
  test::requireGpuOrSkip();
  auto g = test::fusionGptStep(true, false, true);
  std::vector<double> base;
  for (const char* regs : {"0", "64", "24,0"})
    for (const char* stages : {"0", "3"}) {
      setenv("TPC_LN_GRAD_REGS", regs, 1);
      setenv("TPC_LN_GRAD_STAGES", stages, 1);
      test::TenSteps run = test::trainTenSteps(*g, CudaOptions{});
      if (base.empty()) base = run.losses;
      const double worst = test::worstRelativeDifference(base, run.losses);
      INFO("TPC_LN_GRAD_REGS=" << regs << " TPC_LN_GRAD_STAGES=" << stages << ": worst relative loss difference "
                               << worst);
      CHECK(worst <= 1e-3);
    }
  unsetenv("TPC_LN_GRAD_STAGES");
  for (const char* bad : {"x", "32,", "65", "-1", "8,x"}) {
    setenv("TPC_LN_GRAD_REGS", bad, 1);
    auto backend = createCudaBackend({}, CudaOptions{});
    Status st = backend->prepare(*g, {});
    INFO("TPC_LN_GRAD_REGS=" << bad);
    REQUIRE_FALSE(st.ok());
    CHECK(st.error().find(std::string("TPC_LN_GRAD_REGS=") + bad) != std::string::npos);
  }
  unsetenv("TPC_LN_GRAD_REGS");
}

}  // namespace tpc
