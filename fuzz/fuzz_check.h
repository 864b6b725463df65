// What every fuzz target shares: FUZZ_CHECK, an oracle that aborts (so libFuzzer saves the input) with
// the condition and a detail, since a failed oracle is a bug the sanitizers alone would not catch.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <string>

#define FUZZ_CHECK(cond, detail)                                                          \
  do {                                                                                    \
    if (!(cond)) {                                                                        \
      std::fprintf(stderr, "%s:%d: oracle failed: %s\n%s\n", __FILE__, __LINE__, #cond,   \
                   std::string(detail).c_str());                                          \
      std::abort();                                                                       \
    }                                                                                     \
  } while (0)
