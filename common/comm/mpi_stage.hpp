// mpi_stage: what the communicator's files (comm.cpp: point-to-point; comm_collectives.cpp: the
// collectives; comm_wait.cpp: the waits; mpi_stage.cpp) share below MPI, internal to
// common/comm/ (and its unit test): MPI_CALL, which turns an MPI error code into a RingZero
// error naming the call; the waits (complete, cancel_requests, wait_for_message,
// wait_for_peers); and HostStage, a message's bytes where MPI can reach them, in a thread's
// reused StagingBuffers.
// Leaves out: everything a lesson calls (comm.hpp).
#pragma once

#include <mpi.h>

#include <cstdint>
#include <string>
#include <vector>

#include "common/core/check.hpp"
#include "common/core/device_backend.hpp"
#include "common/core/device_memory.hpp"

namespace ringzero::comm_detail {

/// Fails with MPI's own message for a return code other than MPI_SUCCESS (`call`: the call's
/// text, as MPI_CALL passes it).
inline void check_mpi(int rc, const char* call) {
  if (rc == MPI_SUCCESS) return;
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  RZ_CHECK(false, call << " failed: " << std::string(msg, static_cast<size_t>(len))
                       << "; check that every rank runs the same command line");
}
#define MPI_CALL(...) ::ringzero::comm_detail::check_mpi((__VA_ARGS__), #__VA_ARGS__)

/// This rank is unwinding from an error: cancels and frees every request still posted, so MPI
/// receives nothing more into buffers about to be freed and reads nothing from them. comm_wait.cpp.
void cancel_requests(std::vector<MPI_Request>& requests);

/// Waits for every request (the sends and receives of one sendrecv with ranks `dest` and `src`):
/// MPI_Waitall, or on a communication thread test and sleep, cancelling them (cancel_requests)
/// and failing (naming both ranks) when the rank is stopping at an error. comm_wait.cpp.
void complete(std::vector<MPI_Request>& requests, int dest, int src);

/// --attribute (PeerWaits on, step_time.hpp): blocks until a message from `src` is there,
/// charged to peer_wait, so that the receive that follows is the transfer alone (MPI_Probe; on a
/// communication thread MPI_Iprobe, sleeping between tries).
void wait_for_message(int src);

/// --attribute (PeerWaits on, step_time.hpp): before a collective, waits until every rank has
/// reached it (MPI_Ibarrier), charged to peer_wait, so that the collective after it is charged
/// as transfer alone: a collective cannot finish before its last rank arrives, and the barrier
/// tells that wait apart (the way MPI profilers measure load imbalance). Off, it does nothing:
/// no message, no clock read. On the communication thread it tests and sleeps, and gives up
/// when the rank is stopping at an error (Communicator::set_abandon_flag_this_thread).
void wait_for_peers();

// The host buffers a thread stages messages in, kept and reused (a step stages the same sizes
// every time; page-locked memory is slow to allocate): at most two are in use at once (a
// sendrecv's two sides, a collective's input and output), each grown to the largest message it
// held. Freed with the thread, through the backend that made them. mpi_stage.cpp.
class StagingBuffers {
 public:
  ~StagingBuffers();
  /// A buffer of at least `bytes` for messages of `device` (not cpu), held until release().
  char* acquire(DeviceBackend& device, int64_t bytes);
  void release(char* data);
  /// This thread's.
  static StagingBuffers& of_this_thread();

 private:
  struct Slot {
    DeviceBackend* backend = nullptr;
    char* data = nullptr;
    int64_t capacity = 0;
    bool in_use = false;
  };
  std::vector<Slot> slots_;
};

// A message's bytes where MPI can reach them, the host: `data` itself when it lives there, else
// a staging buffer (the device backend's allocate_staging: page-locked on CUDA, reused), filled
// from the device when `fill`, and written back to it by finish() (MPI staged through host
// memory; the counters count the message, not the copies).
class HostStage {
 public:
  HostStage(const void* data, int64_t bytes, bool fill)
      : device_(const_cast<void*>(data)), bytes_(bytes) {
    const Device device = device_of(data);
    if (device == Device::cpu || bytes == 0) {
      host_ = static_cast<char*>(device_);
      return;
    }
    staged_ = StagingBuffers::of_this_thread().acquire(backend(device), bytes);
    host_ = staged_;
    if (fill) copy_memory(host_, data, bytes);
  }
  ~HostStage() {
    if (staged_ != nullptr) StagingBuffers::of_this_thread().release(staged_);
  }
  HostStage(const HostStage&) = delete;
  HostStage& operator=(const HostStage&) = delete;
  char* data() { return host_; }
  float* floats() { return reinterpret_cast<float*>(host_); }
  /// The bytes received into data() back to the device (nothing to do on the host).
  void finish() {
    if (staged_ != nullptr) copy_memory(device_, host_, bytes_);
  }

 private:
  void* device_;
  int64_t bytes_;
  char* staged_ = nullptr;  // the staging buffer, when data lives on a device
  char* host_ = nullptr;
};

}  // namespace ringzero::comm_detail
