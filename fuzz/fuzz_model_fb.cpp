// Fuzzes the binary model-file loader (flatbuffers verification, then modelFromFb and Graph::create).
#include "fuzz_model_common.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) { return fuzzModelFile(data, size, false); }
