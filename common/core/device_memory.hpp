// device_memory: where an array lives (the host or a device) and the bytes that move between.
//
// Provides: Device (cpu, emulated, cuda), the allocation calls that every Buffer and Tensor on a
// device goes through (allocate_on, free_on: the device's backend allocates, zero-filled), the
// one question every operation asks before it runs (device_of: which device holds this
// address), and copy_memory / zero_memory, which work whatever side each pointer is on (the
// host's memcpy/memset, or the device's copies: cudaMemcpy with cudaMemcpyDefault on a GPU).
// PyTorch's torch.device and Tensor.to, in miniature: an array knows where it lives because
// every allocation made through allocate_on (each Buffer, Tensor and Model on a device) is
// registered here, as [address, address + bytes). (DeviceBuffer, common/device/gpu/device.hpp, is
// the NCCL check's and the kernel check's own GPU array and is not.)
// The backends, the operation table each device provides, are common/core/device_backend.hpp.
// Leaves out: more than one device of a kind per process, streams (everything is in order).
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>
#include <string>

#include "common/core/check.hpp"

namespace ringzero {

/// Where an array lives. cpu: host memory, the loops the chapters show. cuda: a GPU's memory,
/// the CUDA backend (-DRINGZERO_CUDA=ON and a GPU). emulated: the CUDA backend's contract on
/// the CPU: device memory is mapped PROT_NONE in the address space, so host code that touches
/// it directly stops with SIGSEGV, and the backend reaches it through a second mapping
/// (common/core/emulated_device.cpp). What a machine without a GPU proves the device path with.
enum class Device { cpu, emulated, cuda };

/// "cpu", "emulated", "cuda" (the --device values).
const char* device_label(Device device);
/// The Device of a --device value. Errors: any other string (names it and the choices).
Device parse_device(const std::string& name);

/// Which device holds address `p` (cpu for host memory, for null, and for anything not from
/// allocate_on, e.g. an empty array's null data): O(log allocations) on a
/// registry of live device allocations, O(1) while there is none. Thread-safe.
Device device_of(const void* p);
/// `bytes` zero-filled bytes on `device` (not cpu), registered for device_of. Errors: the
/// backend's (no CUDA in this build, out of device memory: names the bytes).
void* allocate_on(Device device, int64_t bytes);
/// Frees what allocate_on(device, ...) returned (null: nothing).
void free_on(Device device, void* p);
/// `bytes` bytes from src to dst, each on the host or on a device (memcpy's contract: no
/// overlap). Synchronous: dst holds them when it returns.
void copy_memory(void* dst, const void* src, int64_t bytes);
/// `bytes` zero bytes at p, on the host or on a device.
void zero_memory(void* p, int64_t bytes);

/// dst = src, element for element, each on the host or a device (PyTorch's Tensor.copy_; on
/// the host a memcpy, std::copy's bits). Errors: sizes differ (names both).
template <class T>
void copy_elements(std::span<const T> src, std::span<T> dst) {
  RZ_CHECK(src.size() == dst.size(),
           "copy_elements: " << src.size() << " elements into " << dst.size());
  copy_memory(dst.data(), src.data(), static_cast<int64_t>(src.size_bytes()));
}
template <class T>
void copy_elements(std::span<T> src, std::span<T> dst) {
  copy_elements(std::span<const T>(src), dst);
}
/// Every element of `s` zero (all bits 0: float's and bf16/fp16's +0), on the host or a
/// device (PyTorch's Tensor.zero_).
template <class T>
void zero_elements(std::span<T> s) {
  zero_memory(s.data(), static_cast<int64_t>(s.size_bytes()));
}

/// The most elements a Scratch holds (256 KiB of float32): what the ledger leaves uncounted.
inline constexpr int64_t kScratchBlock = int64_t{1} << 16;

/// n ≤ kScratchBlock elements of T on `device`, uninitialised and NOT counted in the ledger: the
/// device form of a host loop's stack block (a 16-bit loop's scratch, common/core/half.cpp),
/// freed with it. Thread-safe, so the communication thread's 16-bit adds may make one.
/// Errors: n above kScratchBlock (a caller that should work in blocks).
template <class T>
class Scratch {
 public:
  Scratch(int64_t n, Device device) : device_(device), size_(n) {
    RZ_CHECK(n >= 0 && n <= kScratchBlock,
             "Scratch of " << n << " elements: work in blocks of at most " << kScratchBlock);
    if (n == 0) return;
    data_ = device == Device::cpu ? new T[static_cast<size_t>(n)]
                                  : static_cast<T*>(allocate_on(device, n * sizeof(T)));
  }
  ~Scratch() {
    if (data_ == nullptr) return;
    if (device_ == Device::cpu)
      delete[] data_;
    else
      free_on(device_, data_);
  }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  std::span<T> span() { return {data_, static_cast<size_t>(size_)}; }

 private:
  Device device_;
  int64_t size_;
  T* data_ = nullptr;
};

/// How a loop that needs a temporary walks n elements: body(offset, block) for offset = 0, B,
/// 2B, … below n, where block is min(B, n − offset) uninitialised elements of T to work in,
/// where `device` keeps the data: on the host 512 on the stack (B = 512: no allocation, stays
/// in L1), on a device one Scratch of B = min(n, kScratchBlock). Every 16-bit loop with a
/// temporary walks its spans so (core/half.cpp, precision/mixed.cpp): the same element functions
/// in the same order on either, so the same bits. n ≤ 0 runs nothing.
template <class T, class Body>
void for_each_block(int64_t n, Device device, Body&& body) {
  if (n <= 0) return;
  constexpr int64_t kHostBlock = 512;
  T stack[kHostBlock];
  Scratch<T> scratch(device == Device::cpu ? 0 : std::min(n, kScratchBlock), device);
  const std::span<T> block = device == Device::cpu ? std::span<T>(stack) : scratch.span();
  for (int64_t i = 0; i < n; i += std::ssize(block))
    body(static_cast<size_t>(i),
         block.first(static_cast<size_t>(std::min(std::ssize(block), n - i))));
}

}  // namespace ringzero
