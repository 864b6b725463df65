// Node attributes: typed values (int, float, bool, string, int list, dtype) keyed by name.
// Which attributes an op takes, their kinds and defaults, are declared in ops.def.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>
#include <variant>
#include <vector>

#include "ir/dtype.h"

namespace tpc {

enum class AttrKind : uint8_t { Int, Float, Bool, Str, Ints, DType };
std::string_view attrKindName(AttrKind k);

class Attr {
 public:
  Attr() : v_(int64_t(0)) {}
  Attr(int64_t v) : v_(v) {}
  Attr(int v) : v_(int64_t(v)) {}
  Attr(double v) : v_(v) {}
  Attr(bool v) : v_(v) {}
  Attr(std::string v) : v_(std::move(v)) {}
  Attr(const char* v) : v_(std::string(v)) {}
  Attr(std::vector<int64_t> v) : v_(std::move(v)) {}
  Attr(DType v) : v_(v) {}

  AttrKind kind() const { return static_cast<AttrKind>(v_.index()); }
  int64_t i() const { return std::get<int64_t>(v_); }
  double f() const { return std::get<double>(v_); }
  bool b() const { return std::get<bool>(v_); }
  const std::string& s() const { return std::get<std::string>(v_); }
  const std::vector<int64_t>& ints() const { return std::get<std::vector<int64_t>>(v_); }
  DType dtype() const { return std::get<DType>(v_); }

  bool operator==(const Attr& o) const { return v_ == o.v_; }
  bool operator!=(const Attr& o) const { return !(v_ == o.v_); }
  std::string str() const;  // the text form: 1e-05, true, sum, [0,2,1,3], bf16

 private:
  // Order must match AttrKind.
  std::variant<int64_t, double, bool, std::string, std::vector<int64_t>, DType> v_;
};

// Attributes set on one node, kept in the order they were set.
class AttrDict {
 public:
  const Attr* find(std::string_view name) const;
  void set(std::string name, Attr value);
  bool erase(std::string_view name);
  auto begin() const { return items_.begin(); }
  auto end() const { return items_.end(); }
  size_t size() const { return items_.size(); }
  bool empty() const { return items_.empty(); }
  bool operator==(const AttrDict& o) const { return items_ == o.items_; }

 private:
  std::vector<std::pair<std::string, Attr>> items_;
};

// An AttrDict from literal pairs, in order: attrs({{"axis", 1}, {"keepdims", true}}).
inline AttrDict attrs(std::initializer_list<std::pair<const char*, Attr>> kv) {
  AttrDict d;
  for (const auto& [k, v] : kv) d.set(k, v);
  return d;
}

// Formats a double so that parsing it back gives the same bits; always shows it is a float ("1.0").
std::string formatFloat(double v);

}  // namespace tpc
