// DType, TensorType, Mesh, Placement and Attr: names, sizes and text forms.
#include <charconv>
#include <cmath>

#include "ir/attr.h"
#include "ir/dtype.h"
#include "ir/mesh.h"
#include "ir/status.h"
#include "ir/tensor_type.h"

namespace tpc {

std::string_view dtypeName(DType t) {
  switch (t) {
    case DType::f32: return "f32";
    case DType::f64: return "f64";
    case DType::f16: return "f16";
    case DType::bf16: return "bf16";
    case DType::i32: return "i32";
    case DType::i64: return "i64";
    case DType::boolean: return "bool";
  }
  return "?";
}

std::optional<DType> parseDType(std::string_view s) {
  for (DType t : {DType::f32, DType::f64, DType::f16, DType::bf16, DType::i32, DType::i64, DType::boolean})
    if (dtypeName(t) == s) return t;
  return std::nullopt;
}

int64_t dtypeSize(DType t) {
  switch (t) {
    case DType::f64: case DType::i64: return 8;
    case DType::f32: case DType::i32: return 4;
    case DType::f16: case DType::bf16: return 2;
    case DType::boolean: return 1;
  }
  return 0;
}

int64_t TensorType::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

bool numelOverflows(llvm::ArrayRef<int64_t> shape) {
  int64_t n = 1;
  for (int64_t d : shape)
    if (__builtin_mul_overflow(n, d, &n)) return true;
  return false;
}

std::string shapeStr(llvm::ArrayRef<int64_t> shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? "," : "") + std::to_string(shape[i]);
  return s + "]";
}

std::string TensorType::str() const { return std::string(dtypeName(dtype)) + shapeStr(shape); }

int64_t Mesh::numRanks() const {
  int64_t n = 1;
  for (const auto& a : axes) n *= a.size;
  return n;
}

int Mesh::axisIndex(const std::string& name) const {
  for (size_t i = 0; i < axes.size(); ++i)
    if (axes[i].name == name) return static_cast<int>(i);
  return -1;
}

int64_t Mesh::axisSize(const std::string& name) const {
  int i = axisIndex(name);
  return i < 0 ? 1 : axes[i].size;
}

std::string Mesh::str() const {
  std::string s = "mesh(";
  for (size_t i = 0; i < axes.size(); ++i) s += (i ? ", " : "") + axes[i].name + "=" + std::to_string(axes[i].size);
  return s + ")";
}

std::string AxisPlacement::str() const {
  switch (kind) {
    case Kind::R: return "R";
    case Kind::P: return "P";
    case Kind::S: return "S(" + std::to_string(dim) + ")";
  }
  return "?";
}

AxisPlacement Placement::get(const std::string& axis) const {
  for (const auto& [name, p] : axes)
    if (name == axis) return p;
  return AxisPlacement::replicated();
}

void Placement::set(const std::string& axis, AxisPlacement p) {
  for (auto& [name, q] : axes)
    if (name == axis) {
      q = p;
      return;
    }
  axes.emplace_back(axis, p);
}

bool Placement::operator==(const Placement& o) const {
  // Equal when every axis either lists says the same (an absent axis is R).
  for (const auto& [name, p] : axes)
    if (o.get(name) != p) return false;
  for (const auto& [name, p] : o.axes)
    if (get(name) != p) return false;
  return true;
}

std::string Placement::str() const {
  std::string s = "[";
  for (size_t i = 0; i < axes.size(); ++i) s += (i ? ", " : "") + axes[i].first + ":" + axes[i].second.str();
  return s + "]";
}

std::string_view attrKindName(AttrKind k) {
  switch (k) {
    case AttrKind::Int: return "an integer";
    case AttrKind::Float: return "a float";
    case AttrKind::Bool: return "a bool";
    case AttrKind::Str: return "a name";
    case AttrKind::Ints: return "an integer list";
    case AttrKind::DType: return "a dtype";
  }
  return "?";
}

std::string formatFloat(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof buf, v);
  std::string s(buf, r.ptr);
  if (s.find_first_of(".eE") == std::string::npos) s += ".0";
  return s;
}

std::string Attr::str() const {
  switch (kind()) {
    case AttrKind::Int: return std::to_string(i());
    case AttrKind::Float: return formatFloat(f());
    case AttrKind::Bool: return b() ? "true" : "false";
    case AttrKind::Str: {
      // Bare when it is an identifier, quoted otherwise.
      const std::string& v = s();
      bool bare = !v.empty() && (std::isalpha(static_cast<unsigned char>(v[0])) || v[0] == '_');
      for (char c : v) bare = bare && (std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.');
      if (bare && v != "true" && v != "false" && v != "inf" && v != "nan") return v;
      std::string q = "\"";
      for (char c : v) {
        if (c == '"' || c == '\\') q += '\\';
        q += c;
      }
      return q + "\"";
    }
    case AttrKind::Ints: return shapeStr(ints());
    case AttrKind::DType: return std::string(dtypeName(dtype()));
  }
  return "?";
}

const Attr* AttrDict::find(std::string_view name) const {
  for (const auto& [k, v] : items_)
    if (k == name) return &v;
  return nullptr;
}

void AttrDict::set(std::string name, Attr value) {
  for (auto& [k, v] : items_)
    if (k == name) {
      v = std::move(value);
      return;
    }
  items_.emplace_back(std::move(name), std::move(value));
}

bool AttrDict::erase(std::string_view name) {
  for (auto it = items_.begin(); it != items_.end(); ++it)
    if (it->first == name) {
      items_.erase(it);
      return true;
    }
  return false;
}

}  // namespace tpc
