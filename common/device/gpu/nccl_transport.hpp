// nccl_transport: the Communicator's device transport on a GPU, NCCL (device_transport.hpp), so
// every chapter's ring hops and collectives on device buffers run over NCCL with no staging
// through host memory. Built only with -DRINGZERO_CUDA=ON.
//
// Provides: gpu_device_count() (0, never an error, when no driver or device is present, so
// callers can skip cleanly) and NcclTransport: one NCCL communicator per MPI rank on the GPU the
// CUDA backend uses (each rank needs its own: CUDA_VISIBLE_DEVICES per rank on a node of several,
// docs/multi-node-gpu.md), bootstrapped by broadcasting the ncclUniqueId over MPI (NCCL docs,
// "Example 2: One device per process"); sendrecv as ncclSend + ncclRecv of bytes in one group (NCCL
// docs, "Point-to-point communication": the pair is one operation, so a ring cannot deadlock); the
// float32 collectives as ncclAllReduce, ncclReduceScatter, ncclAllGather, ncclBroadcast, with
// size_t counts (no INT_MAX split).
// Streams: every call is queued on ONE non-blocking communication stream after an event
// recorded on the calling thread's stream (its per-thread default stream, device.hpp), so it
// reads what that thread queued before it and writes before anything that thread queues after;
// it returns once the communication stream is done. The chapters' communication queue
// (common/comm/comm_queue.hpp) calls it from its own thread, whose stream starts each job after
// the work the step's thread had queued when it submitted the job (an event recorded at submit:
// common/comm/comm_thread.hpp), so a collective waits for the gradients it carries, not for the
// compute queued after them, and the main thread keeps queueing kernels while NCCL runs. How much
// DDP's buckets and ZeRO-3's prefetch then overlap on a GPU is not measured (no GPU yet).
// Leaves out: several devices per process; a host that does not block while a collective runs
// (the queue's thread does).
#pragma once

#include <memory>
#include <mutex>
#include <string>

#include "common/comm/comm.hpp"
#include "common/comm/device_transport.hpp"

namespace ringzero {

/// Number of visible CUDA devices; 0 when there is no driver, no device, or CUDA fails (`why`
/// then says which).
int gpu_device_count(std::string* why = nullptr);

class NcclTransport final : public DeviceTransport {
 public:
  /// Joins every rank into one NCCL communicator, each on the GPU the CUDA backend selected.
  /// Errors (on every rank): two ranks on one GPU (names them and the fix), any CUDA or NCCL
  /// failure (with NCCL's error string). Collective over all ranks of `comm`.
  explicit NcclTransport(Communicator& comm);
  ~NcclTransport() override;
  NcclTransport(const NcclTransport&) = delete;
  NcclTransport& operator=(const NcclTransport&) = delete;

  std::string name() const override { return "nccl"; }
  Device device() const override { return Device::cuda; }
  /// The CUDA device this rank uses (the backend's).
  int gpu() const { return gpu_; }
  void sendrecv(const void* send, int64_t send_bytes, int dest, void* recv, int64_t recv_bytes,
                int src) override;
  void broadcast(float* buf, int64_t n, int root) override;
  void all_reduce(float* buf, int64_t n) override;
  void reduce_scatter(const float* in, float* out, int64_t n) override;
  void all_gather(const float* in, float* out, int64_t n) override;

 private:
  // One call, `op`: under the lock, the communication stream waits for the work the calling
  // thread has queued so far, `queue(comm, stream)` queues NCCL's work on it, and the call
  // returns when that is done (synchronize).
  template <class Queue>
  void run(const char* op, Queue queue);
  // Waits until everything queued on the communication stream is done (Communicator::wait_until:
  // a communication thread gives up when its rank stops at an error, aborting NCCL). op: the call.
  void synchronize(const char* op);
  int gpu_ = -1;
  void* nccl_ = nullptr;    // ncclComm_t
  void* stream_ = nullptr;  // cudaStream_t, non-blocking: overlaps the callers' streams
  void* ready_ = nullptr;   // cudaEvent_t recorded on the caller's stream before each call
  // One call at a time: NCCL calls of one communicator must be issued in the same order on
  // every rank, and ready_ is shared.
  std::mutex mutex_;
};

/// NCCL's transport for `comm` (nccl_transport_factory() in a CUDA build: register_nccl.cpp).
std::unique_ptr<DeviceTransport> make_nccl_transport(Communicator& comm);

}  // namespace ringzero
