// The IR: a Graph of Nodes in SSA form. Values are inputs, parameters or node results; each has a
// TensorType and, after sharding, a Placement. Nodes are kept in a topological (program) order.
#pragma once

#include <list>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ir/attr.h"
#include "ir/mesh.h"
#include "ir/op.h"
#include "ir/status.h"
#include "ir/tensor_type.h"
#include "llvm/ADT/ArrayRef.h"
#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/SmallVector.h"

namespace tpc {

class Node;
class Graph;

// How a parameter is initialized: normal(std), uniform(lo, hi), zeros, ones, const(v).
struct InitSpec {
  std::string kind;  // empty: no initializer
  std::vector<double> args;
  bool empty() const { return kind.empty(); }
  bool operator==(const InitSpec& o) const { return kind == o.kind && args == o.args; }
  std::string str() const;  // "normal(0.02)"
};
Status validateInit(const InitSpec& init);

// A source position in a .tir file, for errors.
struct Loc {
  int line = 0, col = 0;
  bool valid() const { return line > 0; }
};

class Value {
 public:
  enum class Kind : uint8_t { Input, Param, Result };

  Kind kind() const { return kind_; }
  bool isInput() const { return kind_ == Kind::Input; }
  bool isParam() const { return kind_ == Kind::Param; }
  const TensorType& type() const { return type_; }
  void setType(TensorType t) { type_ = std::move(t); }
  DType dtype() const { return type_.dtype; }
  const Shape& shape() const { return type_.shape; }
  // Empty or all digits means "unnamed": the printer numbers it.
  const std::string& name() const { return name_; }
  void setName(std::string n) { name_ = std::move(n); }
  bool hasName() const;
  std::string ref() const;  // "%name", or "%id" when unnamed: for errors and logs
  Node* def() const { return def_; }  // null for inputs and params
  unsigned resultIndex() const { return index_; }
  unsigned id() const { return id_; }  // creation order in its graph; stable, for deterministic maps
  const std::optional<Placement>& placement() const { return place_; }
  void setPlacement(std::optional<Placement> p) { place_ = std::move(p); }
  const InitSpec& init() const { return init_; }  // params only
  void setInit(InitSpec i) { init_ = std::move(i); }
  Loc loc() const { return loc_; }  // inputs and params parsed from text
  void setLoc(Loc l) { loc_ = l; }

 private:
  friend class Graph;
  Kind kind_ = Kind::Result;
  TensorType type_;
  std::string name_;
  Node* def_ = nullptr;
  unsigned index_ = 0;
  unsigned id_ = 0;
  std::optional<Placement> place_;
  InitSpec init_;
  Loc loc_;
};

class Node {
 public:
  OpKind op() const { return op_; }
  const OpInfo& info() const { return opInfo(op_); }
  std::string_view opName() const { return info().name; }
  bool has(uint32_t trait) const { return info().has(trait); }

  llvm::ArrayRef<Value*> operands() const { return operands_; }
  Value* operand(unsigned i) const { return operands_[i]; }
  unsigned numOperands() const { return static_cast<unsigned>(operands_.size()); }
  void setOperand(unsigned i, Value* v) { operands_[i] = v; }
  llvm::ArrayRef<Value*> results() const { return results_; }
  Value* result(unsigned i = 0) const { return results_[i]; }
  unsigned numResults() const { return static_cast<unsigned>(results_.size()); }

  // Attributes: getters fall back to the op's declared default; asking for an attribute the op does
  // not declare, or a required one that is unset, is a compiler bug.
  const AttrDict& attrs() const { return attrs_; }
  void setAttr(std::string name, Attr v) { attrs_.set(std::move(name), std::move(v)); }
  void eraseAttr(std::string_view name) { attrs_.erase(name); }
  const Attr& attr(std::string_view name) const;
  int64_t getInt(std::string_view name) const { return attr(name).i(); }
  double getFloat(std::string_view name) const { return attr(name).f(); }
  bool getBool(std::string_view name) const { return attr(name).b(); }
  const std::string& getStr(std::string_view name) const { return attr(name).s(); }
  const std::vector<int64_t>& getInts(std::string_view name) const { return attr(name).ints(); }
  DType getDType(std::string_view name) const { return attr(name).dtype(); }

  Loc loc() const { return loc_; }
  void setLoc(Loc l) { loc_ = l; }
  Graph* graph() const { return graph_; }

 private:
  friend class Graph;
  OpKind op_{};
  llvm::SmallVector<Value*, 4> operands_;
  llvm::SmallVector<Value*, 2> results_;
  AttrDict attrs_;
  Loc loc_;
  Graph* graph_ = nullptr;
  std::list<std::unique_ptr<Node>>::iterator self_;
};

struct GraphOutput {
  std::string name;  // empty: the value's own name
  Value* value = nullptr;
};

class Graph {
 public:
  using NodeList = std::list<std::unique_ptr<Node>>;

  explicit Graph(std::string name = "main") : name_(std::move(name)) {}
  Graph(const Graph&) = delete;
  Graph& operator=(const Graph&) = delete;

  const std::string& name() const { return name_; }
  void setName(std::string n) { name_ = std::move(n); }
  const Mesh& mesh() const { return mesh_; }
  void setMesh(Mesh m) { mesh_ = std::move(m); }
  // The file this graph was parsed from, for error locations.
  const std::string& sourceName() const { return sourceName_; }
  void setSourceName(std::string s) { sourceName_ = std::move(s); }

  Value* addInput(std::string name, TensorType type);
  Value* addParam(std::string name, TensorType type, InitSpec init = {});
  const std::vector<Value*>& inputs() const { return inputs_; }
  const std::vector<Value*>& params() const { return params_; }
  // Removes an input or parameter that nothing uses any more.
  void removeArgument(Value* v);

  // Creates a node, inferring its result types with the op's shape rule; errors are the user's
  // (bad shapes, missing attributes) and come back as a Result. Inserted before `before`, or at the end.
  Result<Node*> create(OpKind op, llvm::ArrayRef<Value*> operands, AttrDict attrs = {}, Node* before = nullptr);
  // Creates a node with the given result types, unchecked (the parser; the verifier checks later).
  Node* createWithTypes(OpKind op, llvm::ArrayRef<Value*> operands, AttrDict attrs,
                        llvm::ArrayRef<TensorType> resultTypes, Node* before = nullptr);
  // Removes a node; its results must have no uses left.
  void erase(Node* n);
  // Moves `n` to just before `before` (or to the end).
  void move(Node* n, Node* before);

  // Every use of `from` (operands and outputs) now reads `to`.
  void replaceAllUsesWith(Value* from, Value* to);
  // The same where the caller knows every node that reads `from` (computeUsers()): no scan of all the nodes, for
  // passes that rewrite once per micro-batch of an unrolled step.
  void replaceAllUsesWith(Value* from, Value* to, llvm::ArrayRef<Node*> readers);

  // Nodes in program order. Iterating while erasing: iterate over a copy from nodeVector().
  class NodeIterator {
   public:
    explicit NodeIterator(NodeList::const_iterator it) : it_(it) {}
    Node* operator*() const { return it_->get(); }
    NodeIterator& operator++() { ++it_; return *this; }
    bool operator!=(const NodeIterator& o) const { return it_ != o.it_; }
    bool operator==(const NodeIterator& o) const { return it_ == o.it_; }
   private:
    NodeList::const_iterator it_;
  };
  struct NodeRange {
    NodeIterator b, e;
    NodeIterator begin() const { return b; }
    NodeIterator end() const { return e; }
  };
  NodeRange nodes() const { return {NodeIterator(nodes_.begin()), NodeIterator(nodes_.end())}; }
  std::vector<Node*> nodeVector() const;
  size_t numNodes() const { return nodes_.size(); }

  const std::vector<GraphOutput>& outputs() const { return outputs_; }
  void addOutput(Value* v, std::string name = "") { outputs_.push_back({std::move(name), v}); }
  void setOutput(size_t i, Value* v) { outputs_[i].value = v; }
  void clearOutputs() { outputs_.clear(); }
  // The output's name: its own, else the value's.
  std::string outputName(size_t i) const;

  // Users of every value, computed on demand (passes that need them build the map once).
  llvm::DenseMap<const Value*, llvm::SmallVector<Node*, 4>> computeUsers() const;
  // Values read by the graph outputs.
  bool isOutput(const Value* v) const;

  // A deep copy; `map` (if given) receives old value -> new value.
  std::unique_ptr<Graph> clone(llvm::DenseMap<const Value*, Value*>* map = nullptr) const;

 private:
  Value* newValue(Value::Kind kind, std::string name, TensorType type);
  Node* insertNode(std::unique_ptr<Node> n, Node* before);
  void replaceOutputUses(Value* from, Value* to);

  std::string name_;
  std::string sourceName_;
  Mesh mesh_;
  std::vector<std::unique_ptr<Value>> values_;
  std::vector<Value*> inputs_, params_;
  NodeList nodes_;
  std::vector<GraphOutput> outputs_;
  unsigned nextValueId_ = 0;
};

}  // namespace tpc
