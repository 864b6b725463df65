// HostTensor: a tensor in host memory, stored in its declared dtype (f16/bf16 as their 16-bit patterns).
#pragma once

#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "ir/tensor_type.h"

namespace tpc {

class HostTensor {
 public:
  HostTensor() = default;
  // Zero-filled tensor of the given type.
  explicit HostTensor(TensorType type)
      : type_(std::move(type)), data_(std::make_shared<std::vector<uint8_t>>(static_cast<size_t>(type_.bytes()))) {}

  static HostTensor scalarF32(float v) {
    HostTensor t(TensorType(DType::f32, {}));
    *t.data<float>() = v;
    return t;
  }

  const TensorType& type() const { return type_; }
  DType dtype() const { return type_.dtype; }
  const Shape& shape() const { return type_.shape; }
  int64_t numel() const { return type_.numel(); }
  size_t bytes() const { return data_ ? data_->size() : 0; }
  bool empty() const { return !data_; }

  template <class T>
  T* data() { return reinterpret_cast<T*>(data_->data()); }
  template <class T>
  const T* data() const { return reinterpret_cast<const T*>(data_->data()); }
  uint8_t* raw() { return data_->data(); }
  const uint8_t* raw() const { return data_->data(); }

  // A deep copy (HostTensor copies share storage by default).
  HostTensor clone() const {
    HostTensor t(type_);
    if (bytes()) std::memcpy(t.raw(), raw(), bytes());
    return t;
  }
  // Element i converted to double (any dtype), and back.
  double getAsDouble(int64_t i) const;
  void setFromDouble(int64_t i, double v);
  // A copy converted to another dtype (float <-> float with rounding, int <-> int).
  HostTensor convertTo(DType d) const;

 private:
  TensorType type_;
  std::shared_ptr<std::vector<uint8_t>> data_;
};

// bf16 and f16 conversions (round to nearest even), shared by the CPU backend and tests.
uint16_t floatToBf16(float f);
float bf16ToFloat(uint16_t h);
uint16_t floatToF16(float f);
float f16ToFloat(uint16_t h);

}  // namespace tpc
