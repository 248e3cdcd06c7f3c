#include "common/core/device_backend.hpp"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>

#include "common/core/check.hpp"
#include "common/core/step_time.hpp"

namespace ringzero {

namespace {

// Live device allocations, [begin, end) by begin. `live` lets the host-only run (no device
// allocation ever) answer device_of without the lock.
struct Registry {
  struct Range {
    uintptr_t end;
    Device device;
  };
  std::mutex mutex;
  std::map<uintptr_t, Range> ranges;
  std::atomic<int64_t> live{0};
};
Registry& registry() {
  static Registry r;
  return r;
}

}  // namespace

const char* device_label(Device device) {
  switch (device) {
    case Device::cpu: return "cpu";
    case Device::emulated: return "emulated";
    case Device::cuda: return "cuda";
  }
  return "?";
}

Device parse_device(const std::string& name) {
  for (Device d : {Device::cpu, Device::emulated, Device::cuda})
    if (name == device_label(d)) return d;
  RZ_CHECK(false, "--device " << name << ": not a device; use cpu, emulated or cuda");
  return Device::cpu;
}

Device device_of(const void* p) {
  Registry& r = registry();
  if (p == nullptr || r.live.load(std::memory_order_acquire) == 0) return Device::cpu;
  const auto a = reinterpret_cast<uintptr_t>(p);
  std::lock_guard lock(r.mutex);
  auto it = r.ranges.upper_bound(a);
  if (it == r.ranges.begin()) return Device::cpu;
  --it;
  return a < it->second.end ? it->second.device : Device::cpu;
}

void* allocate_on(Device device, int64_t bytes) {
  RZ_CHECK(device != Device::cpu, "allocate_on(cpu): host memory is a Buffer's allocator's");
  RZ_CHECK(bytes >= 0, "allocate_on(" << device_label(device) << ", " << bytes << " bytes)");
  if (bytes == 0) return nullptr;
  void* p = backend(device).allocate(bytes);
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  const auto a = reinterpret_cast<uintptr_t>(p);
  r.ranges[a] = {a + static_cast<uintptr_t>(bytes), device};
  r.live.fetch_add(1, std::memory_order_release);
  return p;
}

void free_on(Device device, void* p) {
  if (p == nullptr) return;
  {
    Registry& r = registry();
    std::lock_guard lock(r.mutex);
    auto it = r.ranges.find(reinterpret_cast<uintptr_t>(p));
    RZ_CHECK(it != r.ranges.end() && it->second.device == device,
             "free_on(" << device_label(device) << "): " << p << " is not a live allocation there");
    r.ranges.erase(it);
    r.live.fetch_sub(1, std::memory_order_release);
  }
  backend(device).free(p);
}

void copy_memory(void* dst, const void* src, int64_t bytes) {
  if (bytes <= 0) return;
  const PartScope copies(StepPart::copies);  // --attribute
  const Device to = device_of(dst), from = device_of(src);
  if (to == Device::cpu && from == Device::cpu)
    return static_cast<void>(std::memcpy(dst, src, static_cast<size_t>(bytes)));
  RZ_CHECK(to == Device::cpu || from == Device::cpu || to == from,
           "copy_memory from " << device_label(from) << " to " << device_label(to)
                               << ": copy through the host");
  backend(to != Device::cpu ? to : from).copy(dst, src, bytes);
}

void zero_memory(void* p, int64_t bytes) {
  if (bytes <= 0) return;
  if (DeviceBackend* d = backend_of({p})) return d->zero(p, bytes);
  std::memset(p, 0, static_cast<size_t>(bytes));
}

void* DeviceBackend::allocate_staging(int64_t bytes) {
  void* p = std::malloc(static_cast<size_t>(std::max<int64_t>(bytes, 1)));
  RZ_CHECK(p != nullptr, "out of memory staging " << bytes << " bytes of a message");
  return p;
}

void DeviceBackend::free_staging(void* p) {
  std::free(p);
}

BackendFactory& cuda_backend_factory() {
  static BackendFactory factory = nullptr;
  return factory;
}

namespace {
// The CUDA backend, once backend(cuda) has made it: what a communication job is ordered on.
std::atomic<DeviceBackend*> made_cuda{nullptr};
}  // namespace

std::shared_ptr<void> mark_device_work(bool timed) {
  DeviceBackend* d = made_cuda.load(std::memory_order_acquire);
  return d ? d->mark_queued_work(timed) : nullptr;
}

double device_elapsed_ms(const std::shared_ptr<void>& from, const std::shared_ptr<void>& to) {
  DeviceBackend* d = made_cuda.load(std::memory_order_acquire);
  return d && from && to ? d->elapsed_ms(from, to) : 0;
}

void wait_for_device_work(const std::shared_ptr<void>& mark) {
  if (DeviceBackend* d = made_cuda.load(std::memory_order_acquire)) d->wait_for_mark(mark);
}

void finish_device_work() {
  if (DeviceBackend* d = made_cuda.load(std::memory_order_acquire)) d->finish_queued_work();
}

DeviceBackend& backend(Device device) {
  RZ_CHECK(device != Device::cpu, "backend(cpu): the host runs the loops themselves");
  if (device == Device::emulated) return emulated_backend();
  RZ_CHECK(cuda_backend_factory() != nullptr,
           "--device cuda: this build has no CUDA path; reconfigure with cmake --preset release "
           "-DRINGZERO_CUDA=ON (needs the CUDA toolkit and NCCL), or run with --device cpu or "
           "--device emulated");
  DeviceBackend& cuda = cuda_backend_factory()();
  made_cuda.store(&cuda, std::memory_order_release);
  return cuda;
}

DeviceBackend* backend_of(std::initializer_list<const void*> pointers) {
  if (registry().live.load(std::memory_order_acquire) == 0) return nullptr;
  const void* first = nullptr;
  Device found = Device::cpu;
  for (const void* p : pointers) {
    if (p == nullptr) continue;
    const Device d = device_of(p);
    RZ_CHECK(first == nullptr || d == found,
             "operands on " << device_label(found) << " and " << device_label(d)
                            << ": move them to one device first (Tensor::to, Model::to)");
    first = p;
    found = d;
  }
  return found == Device::cpu ? nullptr : &backend(found);
}

}  // namespace ringzero
