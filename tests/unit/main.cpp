// Catch2's main for the unit test executable (tests/catch_main.h keeps a count of 77 failures from reading as
// CTest's "skipped").
#include "tests/catch_main.h"
