#include "ledger.hpp"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <new>
#include <utility>

#include "check.hpp"

namespace ringzero {

const char* mem_tag_name(MemTag tag) {
  static const char* names[kNumMemTags] = {"parameters",  "gradients",    "optimizer_state",
                                           "activations", "comm_buffers", "padding",
                                           "dataset"};
  return names[static_cast<int>(tag)];
}

Ledger& Ledger::get() {
  static Ledger ledger;
  return ledger;
}

int64_t Ledger::model_states_current() const {
  return current(MemTag::parameters) + current(MemTag::gradients) +
         current(MemTag::optimizer_state) + current(MemTag::padding);
}

void Ledger::add(MemTag tag, int64_t bytes) {
  int i = static_cast<int>(tag);
  current_[i] += bytes;
  peak_[i] = std::max(peak_[i], current_[i]);
  total_ += bytes;
  total_peak_ = std::max(total_peak_, total_);
  model_states_peak_ = std::max(model_states_peak_, model_states_current());
}

void Ledger::add_device(MemTag tag, int64_t bytes) {
  int i = static_cast<int>(tag);
  device_current_[i] += bytes;
  device_peak_[i] = std::max(device_peak_[i], device_current_[i]);
  device_total_ += bytes;
  device_total_peak_ = std::max(device_total_peak_, device_total_);
}

void Ledger::reset_peaks() {
  peak_ = current_;
  total_peak_ = total_;
  model_states_peak_ = model_states_current();
  device_peak_ = device_current_;
  device_total_peak_ = device_total_;
}

Buffer::Buffer(int64_t size, MemTag tag, bool zero) : size_(size), tag_(tag) {
  RZ_CHECK(size >= 0, "Buffer size " << size << " is negative");
  if (size == 0) return;
  size_t bytes = (static_cast<size_t>(size) * sizeof(float) + 63) / 64 * 64;
  data_ = static_cast<float*>(std::aligned_alloc(64, bytes));
  RZ_CHECK(data_ != nullptr, "out of memory allocating " << bytes << " bytes for "
                                                         << mem_tag_name(tag)
                                                         << "; reduce the model or batch size");
  if (zero) std::memset(data_, 0, bytes);
  Ledger::get().add(tag_, this->bytes());
}

Buffer::~Buffer() {
  release();
}

void Buffer::release() {
  if (data_ != nullptr) {
    Ledger::get().add(tag_, -bytes());
    std::free(data_);
  }
  data_ = nullptr;
  size_ = 0;
}

Buffer::Buffer(Buffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)),
      tag_(other.tag_) {}

Buffer& Buffer::operator=(Buffer&& other) noexcept {
  if (this != &other) {
    release();
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
    tag_ = other.tag_;
  }
  return *this;
}

}  // namespace ringzero
