// padded_buffer: a buffer whose trailing padding the memory ledger counts apart (MemTag::padding),
// for any element type (float, bf16, fp16: sizeof(T) bytes per element, padding included).
//
// ZeRO pads every bucket or layer to a multiple of world_size (chapters/06_zero1/shard.hpp);
// the padding is memory the rank really holds but no model state, so the ledger shows it in
// its own column and each model-state column matches the ZeRO paper's formula exactly.
// Leaves out: where the padding goes (the layouts of chapters 06-08).
#pragma once

#include <cstdint>
#include <span>
#include <type_traits>
#include <utility>

#include "common/core/half.hpp"
#include "common/core/ledger.hpp"

namespace ringzero {

/// An Array (Buffer: float; Buffer16: 16-bit bits) of `size` elements whose last `padding` are
/// counted under MemTag::padding, the rest under `tag`, at sizeof(element) bytes each, on the
/// host or on `device` (the ledger's device column). The ledger moves are ordered so that no
/// tag's peak ever includes bytes that belong to another tag. Use the aliases PaddedBuffer and
/// PaddedBufferOf<T>.
template <class Array>
class BasicPaddedBuffer {
 public:
  using T = std::remove_pointer_t<decltype(std::declval<Array&>().data())>;
  static constexpr int64_t kBytes = sizeof(T);  ///< bytes per element

  BasicPaddedBuffer() = default;
  BasicPaddedBuffer(int64_t size, int64_t padding, MemTag tag, Device device = Device::cpu)
      : padding_(padding) {
    count(device, tag, -kBytes * padding);  // the Array adds all `size` to `tag` ...
    buffer_ = Array(size, tag, device);
    count(device, MemTag::padding, kBytes * padding);  // ... of which `padding` are padding
  }
  ~BasicPaddedBuffer() { release(); }
  BasicPaddedBuffer(BasicPaddedBuffer&& o) noexcept
      : buffer_(std::move(o.buffer_)), padding_(std::exchange(o.padding_, 0)) {}
  BasicPaddedBuffer& operator=(BasicPaddedBuffer&& o) noexcept {
    if (this != &o) {
      release();
      buffer_ = std::move(o.buffer_);
      padding_ = std::exchange(o.padding_, 0);
    }
    return *this;
  }
  BasicPaddedBuffer(const BasicPaddedBuffer&) = delete;
  BasicPaddedBuffer& operator=(const BasicPaddedBuffer&) = delete;

  T* data() { return buffer_.data(); }
  Device device() const { return buffer_.device(); }
  int64_t size() const { return buffer_.size(); }
  std::span<T> span() { return buffer_.span(); }
  std::span<const T> span() const { return buffer_.span(); }
  /// Frees the memory now; the ledger drops it from both tags.
  void release() {
    if (buffer_.size() == 0) return;
    const MemTag tag = buffer_.tag();
    const Device device = buffer_.device();
    buffer_.release();
    count(device, tag, kBytes * padding_);
    count(device, MemTag::padding, -kBytes * padding_);
    padding_ = 0;
  }

 private:
  // The ledger's column for `device`: host memory or the device's.
  static void count(Device device, MemTag tag, int64_t bytes) {
    if (device == Device::cpu)
      Ledger::get().add(tag, bytes);
    else
      Ledger::get().add_device(tag, bytes);
  }
  Array buffer_;
  int64_t padding_ = 0;
};

/// float32 elements, 4 bytes each (chapters 06-08 in fp32).
using PaddedBuffer = BasicPaddedBuffer<Buffer>;
/// Elements of type T (float, bf16, fp16; common/core/half.hpp), sizeof(T) bytes each: the buffers
/// of an engine written over its element type (chapters 06-08).
template <class T>
using PaddedBufferOf = BasicPaddedBuffer<BufferOf<T>>;

}  // namespace ringzero
