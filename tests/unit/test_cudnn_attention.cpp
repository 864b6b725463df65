// cuDNN's fused attention graphs (runtime/cuda/cudnn_attention.h) without a GPU: every tensor and operation
// descriptor of the forward and backward graphs finalizes in the cuDNN this machine has (it checks each
// attribute's type and value), for every attention case of cuda_kernel_cases.h that cuDNN takes; which cases
// it takes. The engines and the numbers are the GPU test's (tests/gpu/test_cudnn_attention.cpp).
#ifdef TPC_HAVE_CUDA

#include <cstdio>
#include <cstdlib>

#include "cuda_kernel_cases.h"
#include "runtime/cuda/cuda_libraries.h"
#include "runtime/cuda/cudnn_attention.h"
#include "test_support.h"

using namespace tpc;
using namespace tpc::test;
using namespace tpc::test::kernels;

namespace {

// Catch2 2 has no SKIP. CTest runs each test case in a process of its own, where exit code 77 reports it
// skipped (SKIP_RETURN_CODE, tests/CMakeLists.txt); a run of several test cases goes on with a warning.
void skipTest(const std::string& why) {
  const Catch::IConfig& config = *Catch::getCurrentContext().getConfig();
  if (Catch::filterTests(Catch::getAllTestCasesSorted(config), config.testSpec(), config).size() == 1) {
    std::printf("SKIPPED: %s\n", why.c_str());
    std::fflush(stdout);
    std::_Exit(77);
  }
  WARN("SKIPPED: " << why);
}

}  // namespace

TEST_CASE("cudnn attention: which attention ops cuDNN takes", "[cuda]") {
  const DType bf = DType::bf16, f = DType::f32;
  auto takes = [](OpKind op, std::vector<TensorType> types, AttrDict a) {
    OneOp o = oneOp(op, types, std::move(a));
    return cuda::cudnnAttentionTakes(*o.node);
  };
  const Shape s{2, 3, 256, 64};
  CHECK(takes(OpKind::Attention, {tt(bf, s), tt(bf, s), tt(bf, s)}, attrs({{"causal", true}})));
  CHECK(takes(OpKind::Attention, {tt(bf, {2, 3, 77, 64}), tt(bf, {2, 3, 77, 64}), tt(bf, {2, 3, 77, 64})},
              attrs({{"causal", true}})));
  CHECK_FALSE(takes(OpKind::Attention, {tt(f, s), tt(f, s), tt(f, s)}, attrs({{"causal", true}})));  // f32
  CHECK_FALSE(takes(OpKind::Attention, {tt(bf, s), tt(bf, s), tt(bf, s)},
                    attrs({{"causal", true}, {"dropout", 0.1}, {"key", 1}})));  // our Philox mask
  CHECK_FALSE(takes(OpKind::Attention, {tt(bf, {2, 3, 50, 64}), tt(bf, {2, 3, 90, 64}), tt(bf, {2, 3, 90, 64})},
                    attrs({{"causal", false}})));  // Tq != Tk
  CHECK_FALSE(takes(OpKind::Attention, {tt(bf, {2, 3, 64, 36}), tt(bf, {2, 3, 64, 36}), tt(bf, {2, 3, 64, 36})},
                    attrs({{"causal", true}})));  // head_dim % 8
  // The backward at T % 128 != 0 needs cuDNN's padding workaround up to 9.15: ours run it.
  const Shape t77{2, 3, 77, 64}, t77lse{2, 3, 77};
  CHECK_FALSE(takes(OpKind::AttentionGrad, {tt(bf, t77), tt(bf, t77), tt(bf, t77), tt(bf, t77), tt(bf, t77), tt(f, t77lse)},
                    attrs({{"causal", true}})));
  const Shape lse{2, 3, 256};
  CHECK(takes(OpKind::AttentionGrad, {tt(bf, s), tt(bf, s), tt(bf, s), tt(bf, s), tt(bf, s), tt(f, lse)},
              attrs({{"causal", true}})));
}

TEST_CASE("cudnn attention: the forward and backward graphs' descriptors finalize", "[cuda]") {
  auto lib = cuda::cudnn();
  if (!lib.ok()) {
    // Without cuDNN the error names the library and the ways to get it (and TPC_ATTENTION=tpc); REQUIRE, so
    // that a wrong message fails rather than being skipped. Nothing else here can be checked: skipped.
    REQUIRE_THAT(lib.error(), Catch::Contains("libcudnn.so.9") && Catch::Contains("TPC_ATTENTION=tpc"));
    skipTest("no cuDNN: " + lib.error());
    return;
  }
  int built = 0, backward = 0;
  for (const Case& c : allCases()) {
    OneOp o = oneOp(c.op, c.types, c.attrs);
    if (!cuda::cudnnAttentionTakes(*o.node)) continue;
    INFO(c.name);
    for (bool deterministic : {true, false}) {
      Status s = cuda::CudnnAttention::checkOperations(*o.node, deterministic);
      if (!s.ok()) FAIL((deterministic ? "deterministic: " : "dQ by atomics: ") << s.error());
    }
    ++built;
    backward += cuda::isAttentionBackward(*o.node);
  }
  CHECK(built >= 8);
  CHECK(backward >= 3);
}

#endif
