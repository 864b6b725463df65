// The op table built from ops.def, with attribute specs parsed once.
#include "ir/op.h"

#include <cstdlib>
#include <tuple>
#include <unordered_map>

#include "ir/assert.h"

namespace tpc {

namespace {

// Parses one default value of an attribute spec ("1e-5", "false", "f32", "sum").
Attr parseDefault(AttrKind kind, const std::string& text) {
  switch (kind) {
    case AttrKind::Int: return Attr(static_cast<int64_t>(std::strtoll(text.c_str(), nullptr, 10)));
    case AttrKind::Float: return Attr(std::strtod(text.c_str(), nullptr));
    case AttrKind::Bool: return Attr(text == "true");
    case AttrKind::Str: return Attr(text);
    case AttrKind::DType: {
      auto d = parseDType(text);
      TPC_ASSERT(d.has_value(), "bad dtype default in ops.def: " + text);
      return Attr(*d);
    }
    case AttrKind::Ints:
      // Only the empty list can be a default (the spec is split on commas).
      TPC_ASSERT(text == "[]", "ops.def: an int-list default must be []");
      return Attr(std::vector<int64_t>{});
  }
  TPC_ASSERT(false, "ops.def: unsupported default for " + text);
}

std::string trim(const std::string& s) {
  size_t b = s.find_first_not_of(' '), e = s.find_last_not_of(' ');
  return b == std::string::npos ? "" : s.substr(b, e - b + 1);
}

// "eps:f=1e-5, axis:s" -> specs.
std::vector<AttrSpec> parseSpec(std::string_view op, const std::string& spec) {
  std::vector<AttrSpec> out;
  size_t pos = 0;
  while (pos < spec.size()) {
    size_t comma = spec.find(',', pos);
    std::string item = trim(spec.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos));
    pos = comma == std::string::npos ? spec.size() : comma + 1;
    if (item.empty()) continue;
    size_t colon = item.find(':');
    TPC_ASSERT(colon != std::string::npos, std::string("ops.def: bad attribute spec for ") + std::string(op));
    AttrSpec a;
    a.name = item.substr(0, colon);
    std::string rest = item.substr(colon + 1), def;
    size_t eq = rest.find('=');
    if (eq != std::string::npos) {
      def = rest.substr(eq + 1);
      rest = rest.substr(0, eq);
    }
    if (rest == "i") a.kind = AttrKind::Int;
    else if (rest == "f") a.kind = AttrKind::Float;
    else if (rest == "b") a.kind = AttrKind::Bool;
    else if (rest == "s") a.kind = AttrKind::Str;
    else if (rest == "ints") a.kind = AttrKind::Ints;
    else if (rest == "dtype") a.kind = AttrKind::DType;
    else TPC_ASSERT(false, "ops.def: unknown attribute kind " + rest);
    if (eq != std::string::npos) a.defaultValue = parseDefault(a.kind, def);
    out.push_back(std::move(a));
  }
  return out;
}

std::vector<OpInfo> buildTable() {
  using namespace traits;
  std::vector<OpInfo> t;
#define OP(Enum, name, nops, nres, tr, attrs) \
  t.push_back(OpInfo{OpKind::Enum, name, nops, nres, static_cast<uint32_t>(tr), parseSpec(name, attrs)});
#include "ir/ops.def"
#undef OP
  // The fuse pass (passes/fusion.cpp) marks the members of one fused kernel with the same fusion_group.
  for (OpInfo& op : t)
    if (op.has(Elementwise)) op.attrs.push_back(AttrSpec{"fusion_group", AttrKind::Int, Attr(int64_t(-1))});
  // dlogits over the logits they are computed from (ops.def, the loss section).
  for (auto [op, res, opd] : {std::tuple{OpKind::CrossEntropyGrad, 0, 1}, std::tuple{OpKind::CrossEntropyWithGrad, 1, 1},
                              std::tuple{OpKind::VocabXentGrad, 0, 1}}) {
    t[static_cast<size_t>(op)].inPlaceResult = res;
    t[static_cast<size_t>(op)].inPlaceOperand = opd;
  }
  return t;
}

}  // namespace

const std::vector<OpInfo>& allOps() {
  static const std::vector<OpInfo> table = buildTable();
  return table;
}

const OpInfo& opInfo(OpKind k) { return allOps()[static_cast<size_t>(k)]; }

std::optional<OpKind> lookupOp(std::string_view name) {
  static const std::unordered_map<std::string_view, OpKind> byName = [] {
    std::unordered_map<std::string_view, OpKind> m;
    for (const OpInfo& i : allOps()) m.emplace(i.name, i.kind);
    return m;
  }();
  auto it = byName.find(name);
  if (it == byName.end()) return std::nullopt;
  return it->second;
}

const AttrSpec* OpInfo::findAttr(std::string_view attr) const {
  for (const AttrSpec& a : attrs)
    if (a.name == attr) return &a;
  return nullptr;
}

}  // namespace tpc
