// The text form of the IR (DESIGN.md "The IR"). Printing, parsing and printing again gives the same text.
#pragma once

#include <string>

#include "llvm/ADT/DenseMap.h"
#include "llvm/Support/raw_ostream.h"

namespace tpc {

class Graph;
class Node;
class Value;

void printGraph(const Graph& g, llvm::raw_ostream& os);
std::string printGraph(const Graph& g);

// The names the printer gives values ("%wte", "%12"): unique, stable for one graph as printed.
class ValueNames {
 public:
  explicit ValueNames(const Graph& g);
  std::string operator()(const Value* v) const;  // with the leading %

 private:
  llvm::DenseMap<const Value*, std::string> names_;
};

// One node on one line, as in the graph's printing (for errors and logs).
std::string printNode(const Node& n, const ValueNames& names);

}  // namespace tpc
