// Internal assertions: a failed TPC_ASSERT is a compiler bug, never a user error (STYLE.md #8).
#pragma once

#include <string>

namespace tpc {
class Graph;
[[noreturn]] void internalError(const char* file, int line, const std::string& msg, const Graph* g);
}  // namespace tpc

#define TPC_ASSERT(cond, msg)                                                        \
  do {                                                                               \
    if (!(cond)) ::tpc::internalError(__FILE__, __LINE__, std::string("assertion `" #cond "` failed: ") + (msg), nullptr); \
  } while (0)

// Like TPC_ASSERT, but prints the graph around the failure.
#define TPC_ASSERT_GRAPH(graph, cond, msg)                                           \
  do {                                                                               \
    if (!(cond)) ::tpc::internalError(__FILE__, __LINE__, std::string("assertion `" #cond "` failed: ") + (msg), &(graph)); \
  } while (0)
