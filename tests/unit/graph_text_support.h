// For unit tests that write graphs as text: the parsed graph (a failed parse fails the test with its error)
// and a value of it by name (a node's result or a parameter).
#pragma once

#include <catch2/catch.hpp>

#include <memory>
#include <string>

#include "ir/graph.h"
#include "ir/parser.h"

namespace tpc::test {

inline std::unique_ptr<Graph> parseTestGraph(const char* text) {
  auto g = parseGraph(text, "<test>");
  INFO((g.ok() ? std::string() : g.error()));
  REQUIRE(g.ok());
  return std::move(*g);
}

inline const Value* namedValue(const Graph& g, const std::string& name) {
  for (const Node* n : g.nodes())
    for (const Value* v : n->results())
      if (v->name() == name) return v;
  for (const Value* v : g.params())
    if (v->name() == name) return v;
  FAIL("no value %" << name);
  return nullptr;
}

}  // namespace tpc::test
