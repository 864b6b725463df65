// HostTensor: a tensor in host memory, stored in its declared dtype (f16/bf16 as their 16-bit patterns).
#pragma once

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <new>
#include <vector>

#include "ir/tensor_type.h"

namespace tpc {

class HostTensor {
 public:
  HostTensor() = default;
  // Zero-filled tensor of the given type. The storage comes from calloc, so a large all-zero tensor costs no
  // memory until it is written (the kernel maps zero pages lazily): gpt2-xl's AdamW moments are 12 GB.
  explicit HostTensor(TensorType type)
      : type_(std::move(type)), data_(std::make_shared<Storage>(static_cast<size_t>(type_.bytes()))) {}

  static HostTensor scalarF32(float v) {
    HostTensor t(TensorType(DType::f32, {}));
    *t.data<float>() = v;
    return t;
  }

  // How a parameter drawn from normal(0, scale) by param_init's counter-based generator is made: element i
  // = scale * tpc_normal_draw(tpc_splitmix64(key + i)) (runtime/normal_draw.h), in f32.
  struct NormalDraw {
    uint64_t key = 0;
    float scale = 0;
  };
  // A tensor whose bytes `fill` writes on first access (raw, data, clone, convertTo, ...), once and
  // thread-safe. Until then pendingNormalDraw() says how they are drawn, so a backend that draws them
  // itself (the CUDA backend, on the GPU) never computes or uploads a host copy: gpt2-xl's 6 GB of weights.
  static HostTensor deferred(TensorType type, NormalDraw draw, std::function<void(uint8_t*)> fill) {
    HostTensor t(std::move(type));
    t.data_->written.store(true, std::memory_order_relaxed);
    t.data_->draw = draw;
    t.data_->fill = std::move(fill);
    t.data_->pending.store(true, std::memory_order_release);
    return t;
  }
  // The draw of a deferred tensor whose bytes were not made yet; null otherwise.
  const NormalDraw* pendingNormalDraw() const {
    return data_ && data_->pending.load(std::memory_order_acquire) ? &data_->draw : nullptr;
  }

  const TensorType& type() const { return type_; }
  DType dtype() const { return type_.dtype; }
  const Shape& shape() const { return type_.shape; }
  int64_t numel() const { return type_.numel(); }
  size_t bytes() const { return data_ ? data_->size : 0; }
  bool empty() const { return !data_; }
  // True while no mutable pointer to the storage was ever handed out: the tensor is still all zeros, as
  // constructed (a backend may then clear device memory instead of copying the bytes).
  bool untouchedZeros() const { return data_ && !data_->written.load(std::memory_order_relaxed); }

  template <class T>
  T* data() { return reinterpret_cast<T*>(raw()); }
  template <class T>
  const T* data() const { return reinterpret_cast<const T*>(raw()); }
  uint8_t* raw() {
    // Read first: threads that share a tensor keep reading the flag's cache line instead of bouncing it.
    if (!data_->written.load(std::memory_order_relaxed)) data_->written.store(true, std::memory_order_relaxed);
    return data_->materialized();
  }
  const uint8_t* raw() const { return data_->materialized(); }

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
  struct Storage {
    explicit Storage(size_t n) : bytes(static_cast<uint8_t*>(std::calloc(n ? n : 1, 1))), size(n) {
      if (!bytes) throw std::bad_alloc();
    }
    ~Storage() { std::free(bytes); }
    Storage(const Storage&) = delete;
    Storage& operator=(const Storage&) = delete;
    uint8_t* materialized() {
      if (pending.load(std::memory_order_acquire))
        std::call_once(once, [this] {
          fill(bytes);
          fill = nullptr;
          pending.store(false, std::memory_order_release);
        });
      return bytes;
    }
    uint8_t* bytes;
    size_t size;
    std::atomic<bool> written{false};
    // Deferred tensors (HostTensor::deferred): fill makes the bytes on first access.
    std::atomic<bool> pending{false};
    std::once_flag once;
    std::function<void(uint8_t*)> fill;
    NormalDraw draw;
  };
  TensorType type_;
  std::shared_ptr<Storage> data_;
};

// bf16 and f16 conversions (round to nearest even), shared by the CPU backend and tests.
uint16_t floatToBf16(float f);
float bf16ToFloat(uint16_t h);
uint16_t floatToF16(float f);
float f16ToFloat(uint16_t h);

}  // namespace tpc
