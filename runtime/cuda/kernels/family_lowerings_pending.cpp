// Placeholder until the kernel families (branch wt-cudak) land: no family lowers anything yet.
#include "runtime/cuda/kernels/family_lowerings.h"

namespace tpc::cuda {
const FamilyLowering* findFamilyLowering(OpKind) { return nullptr; }
}  // namespace tpc::cuda
