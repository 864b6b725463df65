// Graph construction and mutation.
#include "ir/graph.h"

#include <algorithm>
#include <cstdio>
#include <iostream>

#include "ir/assert.h"
#include "ir/printer.h"
#include "ir/shape_rules.h"

namespace tpc {

std::string InitSpec::str() const {
  if (args.empty()) return kind;
  std::string s = kind + "(";
  for (size_t i = 0; i < args.size(); ++i) s += (i ? ", " : "") + formatFloat(args[i]);
  return s + ")";
}

Status validateInit(const InitSpec& init) {
  struct Known {
    const char* kind;
    size_t nargs;
  };
  static const Known known[] = {{"normal", 1}, {"uniform", 2}, {"zeros", 0}, {"ones", 0}, {"const", 1}};
  for (const Known& k : known)
    if (init.kind == k.kind) {
      if (init.args.size() != k.nargs)
        return makeError("initializer '", init.kind, "' takes ", k.nargs, " argument(s), got ", init.args.size());
      if (init.kind == "normal" && init.args[0] < 0) return makeError("normal(std) needs std >= 0");
      return {};
    }
  return makeError("unknown initializer '", init.kind, "' (expected normal(std), uniform(lo, hi), zeros, ones, const(v))");
}

bool Value::hasName() const {
  return !name_.empty() && !std::all_of(name_.begin(), name_.end(), [](char c) { return c >= '0' && c <= '9'; });
}

std::string Value::ref() const { return "%" + (hasName() ? name_ : std::to_string(id_)); }

const Attr& Node::attr(std::string_view name) const {
  if (const Attr* a = attrs_.find(name)) return *a;
  const AttrSpec* spec = info().findAttr(name);
  TPC_ASSERT(spec != nullptr, std::string(opName()) + " has no attribute '" + std::string(name) + "'");
  TPC_ASSERT(spec->defaultValue.has_value(),
             std::string(opName()) + ": required attribute '" + std::string(name) + "' is unset");
  return *spec->defaultValue;
}

Value* Graph::newValue(Value::Kind kind, std::string name, TensorType type) {
  auto v = std::make_unique<Value>();
  v->kind_ = kind;
  v->name_ = std::move(name);
  v->type_ = std::move(type);
  v->id_ = nextValueId_++;
  values_.push_back(std::move(v));
  return values_.back().get();
}

Value* Graph::addInput(std::string name, TensorType type) {
  Value* v = newValue(Value::Kind::Input, std::move(name), std::move(type));
  inputs_.push_back(v);
  return v;
}

Value* Graph::addParam(std::string name, TensorType type, InitSpec init) {
  Value* v = newValue(Value::Kind::Param, std::move(name), std::move(type));
  v->init_ = std::move(init);
  params_.push_back(v);
  return v;
}

void Graph::removeArgument(Value* v) {
  auto& list = v->isParam() ? params_ : inputs_;
  list.erase(std::remove(list.begin(), list.end(), v), list.end());
}

Node* Graph::insertNode(std::unique_ptr<Node> n, Node* before) {
  n->graph_ = this;
  Node* raw = n.get();
  auto pos = before ? before->self_ : nodes_.end();
  raw->self_ = nodes_.insert(pos, std::move(n));
  return raw;
}

Node* Graph::createWithTypes(OpKind op, llvm::ArrayRef<Value*> operands, AttrDict attrs,
                             llvm::ArrayRef<TensorType> resultTypes, Node* before) {
  auto n = std::make_unique<Node>();
  n->op_ = op;
  n->operands_.assign(operands.begin(), operands.end());
  n->attrs_ = std::move(attrs);
  for (unsigned i = 0; i < resultTypes.size(); ++i) {
    Value* r = newValue(Value::Kind::Result, "", resultTypes[i]);
    r->def_ = n.get();
    r->index_ = i;
    n->results_.push_back(r);
  }
  return insertNode(std::move(n), before);
}

Result<Node*> Graph::create(OpKind op, llvm::ArrayRef<Value*> operands, AttrDict attrs, Node* before) {
  const OpInfo& info = opInfo(op);
  if (info.numOperands >= 0 && static_cast<int>(operands.size()) != info.numOperands)
    return makeError(info.name, " takes ", info.numOperands, " operand(s), got ", operands.size());
  if (info.numOperands < 0 && operands.empty()) return makeError(info.name, " takes at least one operand");
  TPC_TRY(checkAttrs(op, attrs));
  std::vector<TensorType> types;
  types.reserve(operands.size());
  for (Value* v : operands) types.push_back(v->type());
  TPC_ASSIGN(auto results, inferTypes(op, types, attrs, mesh_));
  return createWithTypes(op, operands, std::move(attrs), results, before);
}

void Graph::erase(Node* n) {
  TPC_ASSERT(n->graph_ == this, "erasing a node of another graph");
  nodes_.erase(n->self_);
}

void Graph::move(Node* n, Node* before) {
  auto pos = before ? before->self_ : nodes_.end();
  nodes_.splice(pos, nodes_, n->self_);
}

void Graph::replaceAllUsesWith(Value* from, Value* to) {
  for (auto& n : nodes_)
    for (auto& op : n->operands_)
      if (op == from) op = to;
  replaceOutputUses(from, to);
}

void Graph::replaceAllUsesWith(Value* from, Value* to, llvm::ArrayRef<Node*> readers) {
  for (Node* n : readers)
    for (auto& op : n->operands_)
      if (op == from) op = to;
  replaceOutputUses(from, to);
}

void Graph::replaceOutputUses(Value* from, Value* to) {
  for (auto& o : outputs_)
    if (o.value == from) {
      // Keep the output's name stable when the value it reads changes.
      if (o.name.empty() && from->hasName()) o.name = from->name();
      o.value = to;
    }
}

std::vector<Node*> Graph::nodeVector() const {
  std::vector<Node*> v;
  v.reserve(nodes_.size());
  for (auto& n : nodes_) v.push_back(n.get());
  return v;
}

std::string Graph::outputName(size_t i) const {
  const GraphOutput& o = outputs_[i];
  return o.name.empty() ? o.value->name() : o.name;
}

llvm::DenseMap<const Value*, llvm::SmallVector<Node*, 4>> Graph::computeUsers() const {
  llvm::DenseMap<const Value*, llvm::SmallVector<Node*, 4>> users;
  for (auto& n : nodes_)
    for (Value* op : n->operands_) {
      auto& list = users[op];
      if (list.empty() || list.back() != n.get()) list.push_back(n.get());
    }
  return users;
}

bool Graph::isOutput(const Value* v) const {
  return std::any_of(outputs_.begin(), outputs_.end(), [&](const GraphOutput& o) { return o.value == v; });
}

std::unique_ptr<Graph> Graph::clone(llvm::DenseMap<const Value*, Value*>* mapOut) const {
  auto g = std::make_unique<Graph>(name_);
  g->sourceName_ = sourceName_;
  g->mesh_ = mesh_;
  llvm::DenseMap<const Value*, Value*> map;
  auto copyArg = [&](Value* v, Value* nv) {
    nv->place_ = v->place_;
    map[v] = nv;
  };
  for (Value* v : inputs_) copyArg(v, g->addInput(v->name_, v->type_));
  for (Value* v : params_) copyArg(v, g->addParam(v->name_, v->type_, v->init_));
  for (auto& n : nodes_) {
    llvm::SmallVector<Value*, 4> ops;
    for (Value* v : n->operands_) {
      auto it = map.find(v);
      TPC_ASSERT_GRAPH(*this, it != map.end(), "clone: operand defined after its use");
      ops.push_back(it->second);
    }
    llvm::SmallVector<TensorType, 2> types;
    for (Value* r : n->results_) types.push_back(r->type_);
    Node* nn = g->createWithTypes(n->op_, ops, n->attrs_, types);
    nn->loc_ = n->loc_;
    for (unsigned i = 0; i < n->results_.size(); ++i) {
      nn->results_[i]->name_ = n->results_[i]->name_;
      nn->results_[i]->place_ = n->results_[i]->place_;
      map[n->results_[i]] = nn->results_[i];
    }
  }
  for (const GraphOutput& o : outputs_) g->outputs_.push_back({o.name, map.lookup(o.value)});
  if (mapOut) *mapOut = std::move(map);
  return g;
}

[[noreturn]] void internalError(const char* file, int line, const std::string& msg, const Graph* g) {
  std::fflush(stdout);
  std::cerr << "tpc: internal error (a compiler bug, please report it): " << msg << "\n  at " << file << ":" << line
            << "\n";
  if (g) std::cerr << "  in graph:\n" << printGraph(*g);
  std::abort();
}

}  // namespace tpc
