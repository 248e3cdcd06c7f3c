// padded_buffer: a Buffer whose trailing padding the memory ledger counts apart (MemTag::padding).
//
// ZeRO pads every bucket or layer to a multiple of world_size (chapters/06_zero1/shard.hpp);
// the padding is memory the rank really holds but no model state, so the ledger shows it in
// its own column and each model-state column matches the ZeRO paper's formula exactly.
// Leaves out: where the padding goes (the layouts of chapters 06-08).
#pragma once

#include <cstdint>
#include <span>
#include <utility>

#include "ledger.hpp"

namespace ringzero {

/// A Buffer of `size` elements whose last `padding` are counted under MemTag::padding, the
/// rest under `tag`. The ledger moves are ordered so that no tag's peak ever includes bytes
/// that belong to another tag.
class PaddedBuffer {
 public:
  PaddedBuffer() = default;
  PaddedBuffer(int64_t size, int64_t padding, MemTag tag) : padding_(padding) {
    Ledger::get().add(tag, -4 * padding);  // the Buffer adds all `size` to `tag` ...
    buffer_ = Buffer(size, tag);
    Ledger::get().add(MemTag::padding, 4 * padding);  // ... of which `padding` are padding
  }
  ~PaddedBuffer() { release(); }
  PaddedBuffer(PaddedBuffer&& o) noexcept
      : buffer_(std::move(o.buffer_)), padding_(std::exchange(o.padding_, 0)) {}
  PaddedBuffer& operator=(PaddedBuffer&& o) noexcept {
    if (this != &o) {
      release();
      buffer_ = std::move(o.buffer_);
      padding_ = std::exchange(o.padding_, 0);
    }
    return *this;
  }
  PaddedBuffer(const PaddedBuffer&) = delete;
  PaddedBuffer& operator=(const PaddedBuffer&) = delete;

  float* data() { return buffer_.data(); }
  int64_t size() const { return buffer_.size(); }
  std::span<float> span() { return buffer_.span(); }
  std::span<const float> span() const { return buffer_.span(); }
  /// Frees the memory now; the ledger drops it from both tags.
  void release() {
    if (buffer_.size() == 0) return;
    const MemTag tag = buffer_.tag();
    buffer_.release();
    Ledger::get().add(tag, 4 * padding_);
    Ledger::get().add(MemTag::padding, -4 * padding_);
    padding_ = 0;
  }

 private:
  Buffer buffer_;
  int64_t padding_ = 0;
};

}  // namespace ringzero
