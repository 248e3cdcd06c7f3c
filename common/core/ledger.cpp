#include "common/core/ledger.hpp"

#include <algorithm>
#include <malloc.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <new>
#include <utility>

#include "common/core/check.hpp"

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

int64_t Ledger::device_model_states_current() const {
  return device_current(MemTag::parameters) + device_current(MemTag::gradients) +
         device_current(MemTag::optimizer_state) + device_current(MemTag::padding);
}

void Ledger::add_device(MemTag tag, int64_t bytes) {
  int i = static_cast<int>(tag);
  device_current_[i] += bytes;
  device_peak_[i] = std::max(device_peak_[i], device_current_[i]);
  device_total_ += bytes;
  device_total_peak_ = std::max(device_total_peak_, device_total_);
  device_model_states_peak_ = std::max(device_model_states_peak_, device_model_states_current());
}

void Ledger::reset_peaks() {
  peak_ = current_;
  total_peak_ = total_;
  model_states_peak_ = model_states_current();
  device_peak_ = device_current_;
  device_total_peak_ = device_total_;
  device_model_states_peak_ = device_model_states_current();
}

namespace {

// Keeps freed memory in the process for the next allocation of its size, as PyTorch's caching
// allocator does. Every step frees and reallocates the same few buffers (ZeRO-3's gathered
// layers and full gradients, DDP's and ZeRO's buckets, activations). By default glibc serves a
// buffer above 128 KiB with a fresh mmap, or raises that threshold and then returns the freed
// top of the heap to the kernel (M_TRIM_THRESHOLD, twice the threshold): either way the next
// step touches new pages, and each 4 KiB page costs a page fault with the kernel zeroing it.
// Measured on chapter 08 (ToyModel, 2 ranks): ~1300 page faults per step and rank, ~3 ms of the
// main thread per step, the untraced stretch before "backward 2". With the two settings below
// (glibc mallopt(3); 32 MiB is M_MMAP_THRESHOLD's largest value on 64-bit) buffers up to 32 MiB
// come from the heap and the heap keeps up to 1 GiB of freed memory: 0 faults per step. The
// ledger counts what is allocated, so no figure of any chapter changes; the process's resident
// memory may stay at its peak instead of shrinking between steps.
bool keep_freed_memory() {
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
  return true;
}

}  // namespace

float* HostAllocator::allocate(int64_t size, MemTag tag, bool zero) {
  static const bool allocator_set = keep_freed_memory();  // once, before the first allocation
  (void)allocator_set;
  size_t bytes = (static_cast<size_t>(size) * sizeof(float) + 63) / 64 * 64;
  // malloc and align by hand rather than aligned_alloc: glibc's aligned_alloc asks for 64 bytes
  // more than it keeps, so the hole a freed buffer leaves is too small for the next buffer of the
  // same size whenever a small allocation lies next to it (a trace event, a tape entry), and the
  // heap grows into fresh pages at every step instead. Here a freed block fits its successor.
  void* block = std::malloc(bytes + 64);  // malloc aligns to 16: room for the pointer below
  RZ_CHECK(block != nullptr, "out of memory allocating " << bytes << " bytes for "
                                                         << mem_tag_name(tag)
                                                         << "; reduce the model or batch size");
  const auto aligned = (reinterpret_cast<uintptr_t>(block) + sizeof(void*) + 63) / 64 * 64;
  auto* data = reinterpret_cast<float*>(aligned);
  reinterpret_cast<void**>(data)[-1] = block;  // what free() frees
  if (zero) std::memset(data, 0, bytes);
  return data;
}

void HostAllocator::free(float* data) {
  std::free(reinterpret_cast<void**>(data)[-1]);
}

}  // namespace ringzero
