// Printer for the text form.
#include "ir/printer.h"

#include <set>

#include "ir/graph.h"

namespace tpc {

ValueNames::ValueNames(const Graph& g) {
  std::set<std::string> used;
  unsigned counter = 0;
  auto assign = [&](const Value* v) {
    if (v->hasName() && used.insert(v->name()).second) {
      names_[v] = "%" + v->name();
      return;
    }
    names_[v] = "%" + std::to_string(counter++);
  };
  for (const Value* v : g.inputs()) assign(v);
  for (const Value* v : g.params()) assign(v);
  for (const Node* n : g.nodes())
    for (const Value* r : n->results()) assign(r);
}

std::string ValueNames::operator()(const Value* v) const {
  auto it = names_.find(v);
  return it == names_.end() ? "%<undefined>" : it->second;
}

namespace {

std::string argString(const Value* v, const ValueNames& names) {
  std::string s = names(v) + ": " + v->type().str();
  if (v->isParam() && !v->init().empty()) s += " init=" + v->init().str();
  if (v->placement()) s += " place=" + v->placement()->str();
  return s;
}

}  // namespace

std::string printNode(const Node& n, const ValueNames& names) {
  std::string s;
  for (unsigned i = 0; i < n.numResults(); ++i) s += (i ? ", " : "") + names(n.result(i));
  s += " = " + std::string(n.opName()) + "(";
  for (unsigned i = 0; i < n.numOperands(); ++i) s += (i ? ", " : "") + names(n.operand(i));
  s += ")";
  if (!n.attrs().empty()) {
    s += " {";
    bool first = true;
    for (const auto& [k, v] : n.attrs()) {
      s += (first ? "" : ", ") + k + "=" + v.str();
      first = false;
    }
    s += "}";
  }
  s += " : ";
  bool anyPlace = false;
  for (unsigned i = 0; i < n.numResults(); ++i) {
    s += (i ? ", " : "") + n.result(i)->type().str();
    anyPlace = anyPlace || n.result(i)->placement().has_value();
  }
  if (anyPlace) {
    s += " {place=";
    if (n.numResults() == 1) {
      s += n.result(0)->placement()->str();
    } else {
      s += "(";
      for (unsigned i = 0; i < n.numResults(); ++i) {
        const auto& p = n.result(i)->placement();
        s += (i ? ", " : "") + (p ? p->str() : std::string("?"));
      }
      s += ")";
    }
    s += "}";
  }
  return s;
}

void printGraph(const Graph& g, llvm::raw_ostream& os) {
  ValueNames names(g);
  os << "graph @" << g.name() << "(";
  for (size_t i = 0; i < g.inputs().size(); ++i) os << (i ? ", " : "") << argString(g.inputs()[i], names);
  os << ")";
  if (!g.params().empty()) {
    // Few parameters fit on one line; a model's many go one per line.
    bool multiline = g.params().size() > 3;
    os << "\n    params(";
    for (size_t i = 0; i < g.params().size(); ++i) {
      if (i) os << (multiline ? ",\n           " : ", ");
      os << argString(g.params()[i], names);
    }
    os << ")";
  }
  if (!g.mesh().empty()) os << "\n    " << g.mesh().str();
  os << " {\n";
  for (const Node* n : g.nodes()) os << "  " << printNode(*n, names) << "\n";
  os << "  return";
  for (size_t i = 0; i < g.outputs().size(); ++i) {
    const GraphOutput& o = g.outputs()[i];
    std::string vn = names(o.value);
    os << (i ? ", " : " ");
    // Attr's text form of a string: bare when it lexes as one identifier, else quoted.
    if (!o.name.empty() && "%" + o.name != vn) os << Attr(o.name).str() << "=";
    os << vn;
  }
  os << "\n}\n";
}

std::string printGraph(const Graph& g) {
  std::string s;
  llvm::raw_string_ostream os(s);
  printGraph(g, os);
  os.flush();
  return s;
}

}  // namespace tpc
