// nccl_comm: the optional GPU communicator — the same collectives as comm.hpp, over NCCL on
// CUDA device buffers. Built only with -DRINGZERO_CUDA=ON (scripts/test turns it on when the
// CUDA toolkit and NCCL are found).
//
// Provides: gpu_device_count() (0, never an error, when no driver or device is present, so
// callers can skip cleanly), and NcclCommunicator, the NCCL DeviceComm (device_comm.hpp): one
// NCCL communicator per MPI rank on device local_rank, bootstrapped by broadcasting the
// ncclUniqueId over MPI (the standard NCCL-with-MPI recipe, NCCL docs "Example 2: One device per
// process"); sendrecv as ncclSend + ncclRecv in one group (what chapter 04's ring needs);
// all_reduce, reduce_scatter, all_gather, broadcast on float32 device pointers, with 64-bit
// counts, and byte counters exactly like Communicator's (payload handed to NCCL; its ring/tree
// is internal), counted in the host Communicator's counters; async variants for overlap.
// Streams: every call is queued on one non-blocking communication stream after an event recorded
// on the compute stream (the legacy default stream, where the kernels run), so it reads finished
// gradients; the blocking calls then wait for the stream, the async ones return a ticket whose
// event the compute stream can wait for (cudaStreamWaitEvent: the host does not block).
// Leaves out: multiple devices per process, more than one communication stream.
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "common/comm/comm.hpp"
#include "common/device/gpu/device_comm.hpp"

namespace ringzero {

/// Number of visible CUDA devices; 0 when there is no driver, no device, or CUDA fails.
int gpu_device_count(std::string* why = nullptr);

class NcclCommunicator final : public DeviceComm {
 public:
  /// Picks device comm.local_rank() and joins every rank into one NCCL communicator.
  /// Errors: fewer visible devices than local ranks (names both numbers), any CUDA or NCCL
  /// failure (with NCCL's error string). Collective over all ranks of `comm`.
  explicit NcclCommunicator(Communicator& comm);
  ~NcclCommunicator() override;
  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  int device() const { return device_; }
  void send(const float* buf, int64_t n, int dest) override;
  void recv(float* buf, int64_t n, int src) override;
  using DeviceComm::sendrecv;
  void sendrecv(const float* send_buf, int64_t n_send, int dest, float* recv_buf, int64_t n_recv,
                int src) override;
  /// In-place sum over ranks of n floats at device pointer buf; returns when complete.
  void all_reduce(float* buf, int64_t n) override;
  /// in: world_size * n floats, out: n floats (block r of the sum lands on rank r).
  void reduce_scatter(const float* in, float* out, int64_t n) override;
  /// in: n floats, out: world_size * n floats (block r from rank r).
  void all_gather(const float* in, float* out, int64_t n) override;
  void broadcast(float* buf, int64_t n, int root) override;
  /// The collectives above, queued on the communication stream without waiting (see
  /// DeviceComm); each records an event there, which wait() makes the compute stream wait for.
  int64_t all_reduce_async(float* buf, int64_t n) override;
  int64_t reduce_scatter_async(const float* in, float* out, int64_t n) override;
  int64_t all_gather_async(const float* in, float* out, int64_t n) override;
  void wait(int64_t ticket) override;
  void wait_async() override;
  bool overlaps() const override { return true; }
  std::string transport() const override { return "nccl"; }

 private:
  void after_compute();           // the comm stream waits for the kernels queued so far
  int64_t issued();               // records the ticket's event after the op just queued
  void synchronize();
  Communicator& comm_;
  int device_ = -1;
  void* nccl_ = nullptr;    // ncclComm_t
  // Every NCCL call is queued on ONE stream, so they run in the order they were issued, the same
  // on every rank (two NCCL operations of one communicator on two streams may deadlock).
  void* stream_ = nullptr;  // cudaStream_t, non-blocking: overlaps the compute stream
  void* ready_ = nullptr;   // cudaEvent_t recorded on the compute stream before each call
  static constexpr int kTickets = 256;  // events for outstanding async collectives
  void* done_[kTickets] = {};          // cudaEvent_t per ticket, recorded on stream_
  int64_t waited_ = 1;                 // no wait is needed for tickets below it (0: blocking)
};

}  // namespace ringzero
