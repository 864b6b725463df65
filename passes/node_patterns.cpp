#include "passes/node_patterns.h"

#include <algorithm>
#include <numeric>
#include <vector>

namespace tpc {

bool sumsAllButLast(const Node& n) {
  if (n.op() != OpKind::ReduceSum || n.getBool("keepdims")) return false;
  int64_t r = n.operand(0)->type().rank();
  std::vector<int64_t> axes = n.getInts("axes");
  for (int64_t& a : axes)
    if (a < 0) a += r;
  std::sort(axes.begin(), axes.end());
  std::vector<int64_t> want(static_cast<size_t>(std::max<int64_t>(r - 1, 0)));
  std::iota(want.begin(), want.end(), 0);
  return r >= 2 && axes == want;
}

}  // namespace tpc
