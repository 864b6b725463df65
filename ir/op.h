// The op table (generated from ops.def): kinds, traits and attribute schemas.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "ir/attr.h"

namespace tpc {

enum class OpKind : uint16_t {
#define OP(Enum, name, nops, nres, traits, attrs) Enum,
#include "ir/ops.def"
#undef OP
};

// Traits group ops so that passes ask "is this op in group G?" instead of switching over ops.
namespace traits {
enum : uint32_t {
  None = 0,
  Elementwise = 1u << 0,
  Broadcasting = 1u << 1,
  Commutative = 1u << 2,
  Reduction = 1u << 3,
  Collective = 1u << 4,
  Movement = 1u << 5,
  Optimizer = 1u << 6,
  Random = 1u << 7,
  Normalization = 1u << 8,
  Loss = 1u << 9,
  Contraction = 1u << 10,
  Gather = 1u << 11,
  Constant = 1u << 12,
};
}  // namespace traits

struct AttrSpec {
  std::string name;
  AttrKind kind;
  std::optional<Attr> defaultValue;  // empty: required
};

struct OpInfo {
  OpKind kind;
  std::string_view name;
  int numOperands;  // -1: one or more
  int numResults;   // -1: as many as the op's shape rule gives
  uint32_t traits;
  std::vector<AttrSpec> attrs;
  // Result `inPlaceResult` may take the memory of operand `inPlaceOperand` when nothing reads that operand
  // after the node (runtime/memory_plan.h): every backend's kernel reads each element of the operand before
  // it writes the result over it. -1: the op has no such pair.
  int inPlaceResult = -1, inPlaceOperand = -1;

  bool has(uint32_t trait) const { return (traits & trait) == trait; }
  const AttrSpec* findAttr(std::string_view attr) const;
};

const OpInfo& opInfo(OpKind k);
std::optional<OpKind> lookupOp(std::string_view name);
const std::vector<OpInfo>& allOps();
inline std::string_view opName(OpKind k) { return opInfo(k).name; }

}  // namespace tpc
