// Catch2's main for the GPU tests (CTest label `gpu`). Without a GPU every test exits 77, which CTest
// reports as skipped (SKIP_RETURN_CODE), with the reason printed; tests/catch_main.h keeps a count of 77 failures
// from reading as skipped.
#include "tests/catch_main.h"
