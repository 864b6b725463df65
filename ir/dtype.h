// Element types of tensors.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

namespace tpc {

enum class DType : uint8_t { f32, f64, f16, bf16, i32, i64, boolean };

std::string_view dtypeName(DType t);
std::optional<DType> parseDType(std::string_view s);
int64_t dtypeSize(DType t);
inline bool isFloat(DType t) { return t == DType::f32 || t == DType::f64 || t == DType::f16 || t == DType::bf16; }
inline bool isInteger(DType t) { return t == DType::i32 || t == DType::i64; }

}  // namespace tpc
