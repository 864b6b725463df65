// Mesh (named device axes, e.g. dp=2, tp=4) and Placement (per axis: R, S(d) or P), as in DTensor/SBP.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace tpc {

struct MeshAxis {
  std::string name;
  int64_t size = 1;
  bool operator==(const MeshAxis& o) const { return name == o.name && size == o.size; }
};

struct Mesh {
  std::vector<MeshAxis> axes;

  bool empty() const { return axes.empty(); }
  int64_t numRanks() const;
  // Index of the named axis, or -1.
  int axisIndex(const std::string& name) const;
  int64_t axisSize(const std::string& name) const;  // 1 for an axis not in the mesh
  bool operator==(const Mesh& o) const { return axes == o.axes; }
  std::string str() const;  // "mesh(dp=2, tp=4)"
};

// How a value is laid out along one mesh axis.
struct AxisPlacement {
  enum class Kind : uint8_t { R, S, P };
  Kind kind = Kind::R;
  int64_t dim = 0;  // for S only

  static AxisPlacement replicated() { return {Kind::R, 0}; }
  static AxisPlacement split(int64_t d) { return {Kind::S, d}; }
  static AxisPlacement partial() { return {Kind::P, 0}; }
  bool isR() const { return kind == Kind::R; }
  bool isS() const { return kind == Kind::S; }
  bool isP() const { return kind == Kind::P; }
  bool operator==(const AxisPlacement& o) const { return kind == o.kind && (kind != Kind::S || dim == o.dim); }
  bool operator!=(const AxisPlacement& o) const { return !(*this == o); }
  std::string str() const;  // "R", "S(2)", "P"
};

// A value's placement: one entry per named mesh axis; an axis not listed is replicated.
struct Placement {
  std::vector<std::pair<std::string, AxisPlacement>> axes;

  AxisPlacement get(const std::string& axis) const;
  void set(const std::string& axis, AxisPlacement p);
  bool operator==(const Placement& o) const;
  bool operator!=(const Placement& o) const { return !(*this == o); }
  std::string str() const;  // "[dp:S(0), tp:R]"
};

}  // namespace tpc
