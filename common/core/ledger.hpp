// ledger: where every byte of tensor memory goes, per rank.
//
// Provides: MemTag (the categories of the ZeRO paper's accounting plus ours), the process-wide
// Ledger of current and peak bytes per tag, and LedgerArray, the one owning allocation type
// (Buffer on the host; Buffer16 and DeviceBuffer are LedgerArrays too), so the ledger is
// complete by construction.
// Leaves out: allocator caching and fragmentation. Freed buffers stay in the process for reuse
// (glibc settings in ledger.cpp, what PyTorch's caching allocator does too): the resident
// memory can sit above these figures, which count what is allocated.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <utility>

#include "common/core/check.hpp"
#include "common/core/device_memory.hpp"

namespace ringzero {

/// What an allocation holds. "Model states" (ZeRO paper, Rajbhandari et al. 2020, §3) are
/// parameters + gradients + optimizer_state.
enum class MemTag : int {
  parameters,
  gradients,
  optimizer_state,
  activations,
  comm_buffers,
  padding,
  dataset
};
inline constexpr int kNumMemTags = 7;
const char* mem_tag_name(MemTag tag);

/// Current and peak bytes per tag for this process. Not thread-safe for concurrent
/// allocation; RingZero allocates from one thread at a time (the comm thread of chapter 05
/// only uses buffers the main thread allocated).
class Ledger {
 public:
  static Ledger& get();
  void add(MemTag tag, int64_t bytes);  ///< bytes may be negative (a free)
  int64_t current(MemTag tag) const { return current_[static_cast<int>(tag)]; }
  int64_t peak(MemTag tag) const { return peak_[static_cast<int>(tag)]; }
  /// Parameters + gradients + optimizer_state + padding, the quantity the ZeRO formulas give.
  int64_t model_states_current() const;
  int64_t model_states_peak() const { return model_states_peak_; }
  int64_t total_peak() const { return total_peak_; }
  /// Resets every peak to the current value (call after set-up to measure the steady state).
  void reset_peaks();

  /// The device column: bytes of GPU memory (DeviceBuffer, common/device/gpu/device.hpp) per tag,
  /// kept apart from the host bytes above. Zero everywhere on a CPU run.
  void add_device(MemTag tag, int64_t bytes);
  int64_t device_current(MemTag tag) const { return device_current_[static_cast<int>(tag)]; }
  int64_t device_peak(MemTag tag) const { return device_peak_[static_cast<int>(tag)]; }
  int64_t device_total_peak() const { return device_total_peak_; }
  /// The device column's parameters + gradients + optimizer_state + padding, and its peak.
  int64_t device_model_states_current() const;
  int64_t device_model_states_peak() const { return device_model_states_peak_; }

 private:
  std::array<int64_t, kNumMemTags> current_{}, peak_{};
  std::array<int64_t, kNumMemTags> device_current_{}, device_peak_{};
  int64_t device_total_ = 0, device_total_peak_ = 0, device_model_states_peak_ = 0;
  int64_t total_ = 0, total_peak_ = 0, model_states_peak_ = 0;
};

/// The ledger's two columns: host memory, and GPU memory (common/device/gpu/device.hpp).
enum class LedgerColumn { host, device };

/// The owning, move-only array every buffer type is: `size` elements of T from Allocator,
/// counted under `tag` in the ledger's `column` for as long as they live, so the ledger is
/// complete by construction. Allocator provides kName (for errors), T* allocate(int64_t n,
/// MemTag tag, bool zero) (zero-filled when `zero`; errors name the bytes and the tag) and
/// void free(T*). size() is in elements, bytes() = sizeof(T) · size(). Errors: size < 0.
/// An array may also live on a device (common/core/device_memory.hpp): then allocate_on/free_on
/// replace the Allocator and it counts in the device column; to() moves it (Tensor.to).
template <class T, class Allocator, LedgerColumn column = LedgerColumn::host>
class LedgerArray {
 public:
  LedgerArray() = default;
  LedgerArray(int64_t size, MemTag tag) : LedgerArray(size, tag, /*zero=*/true) {}
  /// size zero-filled elements on `device` (cpu: the Allocator's memory).
  LedgerArray(int64_t size, MemTag tag, Device device)
      : LedgerArray(size, tag, /*zero=*/true, device) {}
  /// Like LedgerArray(size, tag) but not zeroed, for a buffer whose every element is written
  /// before it is read (an all-gather's output): zeroing it would cost one more pass (on a
  /// device it comes zeroed: allocate_on's contract).
  static LedgerArray uninitialized(int64_t size, MemTag tag, Device device = Device::cpu) {
    return LedgerArray(size, tag, /*zero=*/false, device);
  }
  ~LedgerArray() { release(); }
  LedgerArray(LedgerArray&& other) noexcept
      : data_(std::exchange(other.data_, nullptr)),
        size_(std::exchange(other.size_, 0)),
        tag_(other.tag_),
        device_(other.device_) {}
  LedgerArray& operator=(LedgerArray&& other) noexcept {
    if (this != &other) {
      release();
      data_ = std::exchange(other.data_, nullptr);
      size_ = std::exchange(other.size_, 0);
      tag_ = other.tag_;
      device_ = other.device_;
    }
    return *this;
  }
  LedgerArray(const LedgerArray&) = delete;
  LedgerArray& operator=(const LedgerArray&) = delete;

  T* data() { return data_; }
  const T* data() const { return data_; }
  int64_t size() const { return size_; }
  int64_t bytes() const { return size_ * static_cast<int64_t>(sizeof(T)); }
  MemTag tag() const { return tag_; }
  /// Where the elements live (cpu for the Allocator's memory).
  Device device() const { return device_; }
  std::span<T> span() { return {data_, static_cast<size_t>(size_)}; }
  std::span<const T> span() const { return {data_, static_cast<size_t>(size_)}; }
  /// Frees the memory now (the ledger drops it); size() becomes 0.
  void release() {
    if (data_ != nullptr) {
      count(-bytes());
      if (device_ == Device::cpu)
        Allocator::free(data_);
      else
        free_on(device_, data_);
    }
    data_ = nullptr;
    size_ = 0;
  }
  /// Moves the elements to `device` (PyTorch's Tensor.to): a new array there holding the same
  /// bytes, this one freed; data() changes, so views into it must be re-pointed.
  void to(Device device) {
    if (device == device_) return;
    LedgerArray moved(size_, tag_, /*zero=*/false, device);
    copy_memory(moved.data_, data_, bytes());
    *this = std::move(moved);
  }

 protected:
  LedgerArray(int64_t size, MemTag tag, bool zero, Device device = Device::cpu)
      : size_(size), tag_(tag), device_(device) {
    RZ_CHECK(size >= 0, Allocator::kName << " size " << size << " is negative");
    if (size == 0) return;
    data_ = device == Device::cpu ? Allocator::allocate(size, tag, zero)
                                  : static_cast<T*>(allocate_on(device, bytes()));
    count(bytes());
  }
  void count(int64_t bytes) const {
    if (column == LedgerColumn::host && device_ == Device::cpu)
      Ledger::get().add(tag_, bytes);
    else
      Ledger::get().add_device(tag_, bytes);
  }

  T* data_ = nullptr;
  int64_t size_ = 0;
  MemTag tag_ = MemTag::dataset;
  Device device_ = Device::cpu;
};

/// Host memory for Buffer: 64-byte aligned, freed blocks kept in the process for reuse
/// (ledger.cpp says why). Errors: out of memory (names bytes and tag).
struct HostAllocator {
  static constexpr const char* kName = "Buffer";
  static float* allocate(int64_t size, MemTag tag, bool zero);
  static void free(float* data);
};

/// An owning, zero-initialised (unless uninitialized()), 64-byte-aligned float32 array, tagged
/// in the Ledger: every float buffer in RingZero on the host.
using Buffer = LedgerArray<float, HostAllocator>;

}  // namespace ringzero
