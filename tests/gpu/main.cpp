// Catch2's main for the GPU tests (CTest label `gpu`). Without a GPU every test exits 77, which CTest
// reports as skipped (SKIP_RETURN_CODE), with the reason printed.
#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>
