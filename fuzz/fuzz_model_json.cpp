// Fuzzes the JSON model-file loader (flatbuffers' JSON parser against the embedded schema, then the same
// checks as .fb).
#include "fuzz_model_common.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) { return fuzzModelFile(data, size, true); }
