// The staging buffers of mpi_stage.hpp: a thread's host buffers for device messages, reused.
#include "common/comm/mpi_stage.hpp"

#include <algorithm>

namespace ringzero::comm_detail {

StagingBuffers::~StagingBuffers() {
  for (const Slot& slot : slots_) slot.backend->free_staging(slot.data);
}

StagingBuffers& StagingBuffers::of_this_thread() {
  thread_local StagingBuffers buffers;
  return buffers;
}

char* StagingBuffers::acquire(DeviceBackend& device, int64_t bytes) {
  Slot* free_slot = nullptr;  // a slot of this device not in use, the largest
  for (Slot& slot : slots_)
    if (!slot.in_use && slot.backend == &device &&
        (free_slot == nullptr || slot.capacity > free_slot->capacity))
      free_slot = &slot;
  if (free_slot == nullptr) free_slot = &slots_.emplace_back(Slot{&device});
  if (free_slot->capacity < bytes) {  // grow: the new size is this message's
    if (free_slot->data != nullptr) device.free_staging(free_slot->data);
    free_slot->data = nullptr;  // (so a failed allocation leaves no dangling pointer)
    free_slot->capacity = 0;
    free_slot->data = static_cast<char*>(device.allocate_staging(bytes));
    free_slot->capacity = bytes;
  }
  free_slot->in_use = true;
  return free_slot->data;
}

void StagingBuffers::release(char* data) {
  for (Slot& slot : slots_)
    if (slot.data == data) slot.in_use = false;
}

}  // namespace ringzero::comm_detail
