// Pieces of generated CUDA C shared by the kernel families: typed accessors for one buffer (storage type,
// load to float / i64, store from float), argument and launch-geometry shorthands, and the dtype checks
// every lowering starts with. Shapes are static, so families bake sizes into the source as constants.
#pragma once

#include <cstdint>
#include <string>

#include "ir/graph.h"
#include "runtime/cuda/kernel_spec.h"

namespace tpc::cuda {

// CUDA C for a buffer called `name` of dtype `t`:
//   typedef <storage> name_t;
//   float name_ld(const name_t* p, i64 i);         float dtypes (f32, bf16, f16)
//   void  name_st(name_t* p, i64 i, float v);      float dtypes
//   i64   name_ld(const name_t* p, i64 i);         integer dtypes (i32, i64)
std::string accessors(const std::string& name, DType t);

// Eight consecutive elements of a float buffer as floats through 16-byte memory operations (two for f32,
// one for bf16/f16); p + i must be 16-byte aligned (buffers are 256-aligned: i a multiple of 8 will do):
//   void name_ld8(const name_t* p, i64 i, float* v);   void name_st8(name_t* p, i64 i, const float* v);
// Needs accessors(name, t) before it.
std::string vectorAccessors(const std::string& name, DType t);

// Kernels here take f32, bf16 and f16 floats and i32/i64 ids; anything else is refused with the op's name.
Status checkFloatDType(const Node& n, DType t, const char* what);
Status checkIdDType(const Node& n, DType t, const char* what);

// A CUDA C literal for a float/double constant ("1.0000000e-05f"), and an i64 literal ("123ll").
std::string floatLit(double v);
std::string doubleLit(double v);
std::string i64Lit(int64_t v);

inline KernelArg operandArg(int64_t k) { return KernelArg{ArgKind::Operand, k}; }
inline KernelArg resultArg(int64_t k) { return KernelArg{ArgKind::Result, k}; }
inline KernelArg workspaceArg(int64_t offset) { return KernelArg{ArgKind::Workspace, offset}; }
inline KernelArg seedArg() { return KernelArg{ArgKind::Seed}; }
inline KernelArg stepArg() { return KernelArg{ArgKind::StepPtr}; }

// Blocks of `block` threads covering n items with a grid-stride loop (at most `maxBlocks`, at least 1).
uint32_t gridFor(int64_t n, uint32_t block, int64_t maxBlocks = 65536);
// A warp-multiple block size for a row of n items reduced by one block: 32..maxThreads.
uint32_t rowBlock(int64_t n, uint32_t maxThreads = 1024);

// Product of dims [b, e) of a shape.
int64_t prodDims(const Shape& s, size_t b, size_t e);

}  // namespace tpc::cuda
