// Common subexpression elimination: a node equal to an earlier one (same op, operands, attributes,
// result types and placements) is replaced by it.   %b = f(%x); %c = f(%x)  =>  uses of %c read %b
#include <algorithm>
#include <map>
#include <string>

#include "passes/builtin_passes.h"
#include "llvm/ADT/DenseMap.h"

namespace tpc {
namespace {

class CSEPass final : public Pass {
 public:
  std::string_view name() const override { return "cse"; }

  Result<bool> run(Graph& g) override {
    llvm::DenseMap<Value*, Value*> replacement;
    std::map<std::string, Node*> seen;
    std::vector<Node*> dead;
    auto canonical = [&](Value* v) {
      auto it = replacement.find(v);
      return it == replacement.end() ? v : it->second;
    };
    for (Node* n : g.nodeVector()) {
      for (unsigned i = 0; i < n->numOperands(); ++i) n->setOperand(i, canonical(n->operand(i)));
      std::string key = keyOf(*n);
      auto [it, inserted] = seen.emplace(key, n);
      if (inserted) continue;
      for (unsigned i = 0; i < n->numResults(); ++i) replacement[n->result(i)] = it->second->result(i);
      dead.push_back(n);
    }
    for (size_t i = 0; i < g.outputs().size(); ++i) {
      Value* v = g.outputs()[i].value;
      if (Value* r = canonical(v); r != v) {
        g.replaceAllUsesWith(v, r);  // keeps the output's name
      }
    }
    for (Node* n : dead) g.erase(n);
    return !dead.empty();
  }

 private:
  // A structural key; operand order is canonical for commutative ops.
  static std::string keyOf(const Node& n) {
    std::vector<unsigned> ids;
    for (Value* v : n.operands()) ids.push_back(v->id());
    if (n.has(traits::Commutative)) std::sort(ids.begin(), ids.end());
    std::string k = std::to_string(static_cast<int>(n.op())) + "(";
    for (unsigned id : ids) k += std::to_string(id) + ",";
    k += "){";
    // Attributes by name: the order they were written or set in does not matter.
    std::map<std::string, std::string> attrs;
    for (const auto& [name, a] : n.attrs()) attrs[name] = a.str();
    for (const auto& [name, a] : attrs) k += name + "=" + a + ",";
    k += "}:";
    for (Value* r : n.results()) {
      k += r->type().str();
      if (r->placement()) k += r->placement()->str();
      k += ";";
    }
    return k;
  }
};

}  // namespace

std::unique_ptr<Pass> createCSEPass() { return std::make_unique<CSEPass>(); }

}  // namespace tpc
