// HostTensor element access and dtype conversions; bf16/f16 rounding is round-to-nearest-even.
#include "runtime/host_tensor.h"

#include <cmath>

namespace tpc {

uint16_t floatToBf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);  // quiet NaN
  uint32_t rounding = 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>((u + rounding) >> 16);
}

float bf16ToFloat(uint16_t h) {
  uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

uint16_t floatToF16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  uint32_t ax = x & 0x7fffffffu;
  if (ax >= 0x7f800000u) return sign | 0x7c00 | (ax > 0x7f800000u ? 0x200 : 0);  // inf, NaN
  if (ax >= 0x477ff000u) return sign | 0x7c00;  // >= 65520 rounds to inf
  if (ax < 0x38800000u) {                        // below 2^-14: a subnormal half (units of 2^-24)
    float a;
    std::memcpy(&a, &ax, 4);
    return sign | static_cast<uint16_t>(std::nearbyint(a * 16777216.0f));  // exact scaling, RNE
  }
  uint32_t mant = ax & 0x7fffffu;
  uint32_t h = ((((ax >> 23) - 127 + 15)) << 10) | (mant >> 13);
  uint32_t rem = mant & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;  // a carry into the exponent is correct
  return sign | static_cast<uint16_t>(h);
}

float f16ToFloat(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
  float f;
  if (e == 0) {
    f = std::ldexp(static_cast<float>(m), -24);
    return sign ? -f : f;
  }
  uint32_t u = e == 31 ? (sign | 0x7f800000u | (m << 13)) : (sign | ((e - 15 + 127) << 23) | (m << 13));
  std::memcpy(&f, &u, 4);
  return f;
}

double HostTensor::getAsDouble(int64_t i) const {
  switch (dtype()) {
    case DType::f32: return data<float>()[i];
    case DType::f64: return data<double>()[i];
    case DType::f16: return f16ToFloat(data<uint16_t>()[i]);
    case DType::bf16: return bf16ToFloat(data<uint16_t>()[i]);
    case DType::i32: return data<int32_t>()[i];
    case DType::i64: return static_cast<double>(data<int64_t>()[i]);
    case DType::boolean: return data<uint8_t>()[i] ? 1.0 : 0.0;
  }
  return 0;
}

void HostTensor::setFromDouble(int64_t i, double v) {
  switch (dtype()) {
    case DType::f32: data<float>()[i] = static_cast<float>(v); break;
    case DType::f64: data<double>()[i] = v; break;
    case DType::f16: data<uint16_t>()[i] = floatToF16(static_cast<float>(v)); break;
    case DType::bf16: data<uint16_t>()[i] = floatToBf16(static_cast<float>(v)); break;
    case DType::i32: data<int32_t>()[i] = static_cast<int32_t>(v); break;
    case DType::i64: data<int64_t>()[i] = static_cast<int64_t>(v); break;
    case DType::boolean: data<uint8_t>()[i] = v != 0.0; break;
  }
}

HostTensor HostTensor::convertTo(DType d) const {
  HostTensor out(TensorType(d, shape()));
  int64_t n = numel();
  if (d == dtype()) {
    if (bytes()) std::memcpy(out.raw(), raw(), bytes());
    return out;
  }
  // Integers go through int64 so that large i64 values survive an i64 <-> i32 copy unchanged in range.
  if (isInteger(dtype()) && isInteger(d)) {
    for (int64_t i = 0; i < n; ++i) {
      int64_t v = dtype() == DType::i32 ? data<int32_t>()[i] : data<int64_t>()[i];
      if (d == DType::i32) out.data<int32_t>()[i] = static_cast<int32_t>(v);
      else out.data<int64_t>()[i] = v;
    }
    return out;
  }
  for (int64_t i = 0; i < n; ++i) out.setFromDouble(i, getAsDouble(i));
  return out;
}

}  // namespace tpc
