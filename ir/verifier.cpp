// The verifier.
#include "ir/verifier.h"

#include "ir/fusion_group.h"
#include "ir/graph.h"
#include "ir/printer.h"
#include "ir/shape_rules.h"
#include "llvm/ADT/DenseSet.h"

namespace tpc {

std::string diagnostic(const Graph& g, Loc loc, const std::string& context, const std::string& msg) {
  if (loc.valid() && !g.sourceName().empty())
    return cat(g.sourceName(), ":", loc.line, ":", loc.col, ": error: ", msg);
  return cat("error: in @", g.name(), ": ", context, ": ", msg);
}

namespace {

Status checkPlacement(const Graph& g, const Value& v, const ValueNames& names, Loc loc, const std::string& context) {
  if (!v.placement()) return {};
  const Placement& p = *v.placement();
  for (const auto& [axis, ap] : p.axes) {
    if (g.mesh().axisIndex(axis) < 0) {
      std::string where = g.mesh().empty() ? "the graph has no mesh(...)" : "the mesh is " + g.mesh().str();
      return Error{diagnostic(g, loc, context, cat("placement of ", names(&v), " names axis '", axis, "', but ", where))};
    }
    if (ap.isS() && (ap.dim < 0 || ap.dim >= v.type().rank()))
      return Error{diagnostic(g, loc, context,
                              cat("placement of ", names(&v), " splits dim ", ap.dim, ", but its type ",
                                  v.type().str(), " has rank ", v.type().rank()))};
  }
  return {};
}

}  // namespace

Status verifyGraph(const Graph& g) {
  ValueNames names(g);
  llvm::DenseSet<const Value*> defined;
  for (const Value* v : g.inputs()) {
    TPC_TRY(checkPlacement(g, *v, names, v->loc(), names(v)));
    defined.insert(v);
  }
  for (const Value* v : g.params()) {
    std::string ctx = "parameter " + names(v);
    if (!v->init().empty())
      if (Status s = validateInit(v->init()); !s.ok()) return Error{diagnostic(g, v->loc(), ctx, s.error())};
    TPC_TRY(checkPlacement(g, *v, names, v->loc(), ctx));
    defined.insert(v);
  }
  for (const Node* n : g.nodes()) {
    std::string ctx = printNode(*n, names);
    auto fail = [&](const std::string& msg) { return Error{diagnostic(g, n->loc(), ctx, msg)}; };
    const OpInfo& info = n->info();
    if (info.numOperands >= 0 && static_cast<int>(n->numOperands()) != info.numOperands)
      return fail(cat(info.name, " takes ", info.numOperands, " operand(s), got ", n->numOperands()));
    if (info.numResults >= 0 && static_cast<int>(n->numResults()) != info.numResults)
      return fail(cat(info.name, " has ", info.numResults, " result(s), got ", n->numResults()));
    std::vector<TensorType> types;
    for (const Value* v : n->operands()) {
      if (!defined.count(v)) return fail(cat("operand ", names(v), " is used before it is defined"));
      types.push_back(v->type());
    }
    if (Status s = checkAttrs(n->op(), n->attrs()); !s.ok()) return fail(s.error());
    auto inferred = inferTypes(n->op(), types, n->attrs(), g.mesh());
    if (!inferred) return fail(inferred.error());
    if (inferred->size() != n->numResults())
      return fail(cat(info.name, " gives ", inferred->size(), " result(s) here, the node has ", n->numResults()));
    for (unsigned i = 0; i < n->numResults(); ++i) {
      const TensorType& declared = n->result(i)->type();
      if (declared != (*inferred)[i])
        return fail(cat("result ", names(n->result(i)), " is declared ", declared.str(), " but ", info.name, " gives ",
                        (*inferred)[i].str()));
      TPC_TRY(checkPlacement(g, *n->result(i), names, n->loc(), ctx));
      defined.insert(n->result(i));
    }
  }
  for (const GraphOutput& o : g.outputs())
    if (!o.value || !defined.count(o.value))
      return Error{diagnostic(g, Loc{}, "return", "returns a value that is not defined in the graph")};
  if (auto groups = fusionGroups(g); !groups.ok()) return Error{diagnostic(g, Loc{}, "fusion groups", groups.error())};
  return {};
}

}  // namespace tpc
