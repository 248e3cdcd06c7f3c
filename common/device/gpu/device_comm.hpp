// device_comm: the communicator's interface on float32 DEVICE buffers, for the NCCL transport.
//
// Provides: DeviceComm (point-to-point send, recv, sendrecv and the collectives all_reduce,
// reduce_scatter, all_gather, broadcast, with the same shapes as Communicator in
// common/comm/comm.hpp), implemented by NcclCommunicator (nccl_comm.hpp): NCCL on one GPU per rank;
// sendrecv is ncclSend + ncclRecv inside ncclGroupStart/End (NCCL docs, "Point-to-point
// communication": a group makes the pair one operation, so a ring cannot deadlock), collectives
// are ncclAllReduce etc. What runs the chapters on a GPU today is not this: the Communicator
// stages device buffers through host memory (common/comm/comm.cpp); wiring NCCL under it is the
// next step, and tests/tools/gpu_comm_check.cpp proves this transport on a GPU meanwhile.
// Counters: NCCL counts into the host Communicator's counters (Communicator::count_external), so
// the end-of-run traffic
// table of a GPU run reads the same counters, under the same names, as a CPU run: sendrecv counts
// one message each way of its length; collectives count their payload; a Scope relabels.
// count_call, Scope and the span form of sendrecv are what chapter 04's ring template
// (ring.hpp) asks of its communicator, so the ring runs unchanged on device buffers.
#pragma once

#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "common/comm/comm.hpp"
#include "common/core/check.hpp"
#include "common/device/gpu/device.hpp"

namespace ringzero {

/// Chapter 04's ring hop add on device buffers (common/core/half.hpp's add_into on float, as a
/// CUDA kernel): dst += src in float32. With it ring_reduce_scatter runs on a DeviceComm.
struct DeviceAdd {
  void operator()(std::span<float> dst, std::span<const float> src) const {
    gpu::add(dst.data(), src.data(), static_cast<int64_t>(dst.size()));
  }
};

/// A collective's interval on the communication stream: marks of a DeviceClock.
struct DeviceSpan {
  std::string name;  ///< the op, or the open Scope's ("ring_reduce_scatter")
  int begin = 0, end = 0;
};

class DeviceComm {
 public:
  /// host: the process's MPI communicator (ranks, and the counters this traffic is counted in).
  explicit DeviceComm(Communicator& host) : host_(host) {}
  virtual ~DeviceComm() = default;
  int rank() const { return host_.rank(); }
  int world_size() const { return host_.world_size(); }
  Communicator& host() { return host_; }

  /// Sends n floats at device pointer buf to dest; returns when the buffer may be reused.
  virtual void send(const float* buf, int64_t n, int dest) = 0;
  /// Receives n floats from src into device pointer buf; returns when they have arrived.
  virtual void recv(float* buf, int64_t n, int src) = 0;
  /// Sends n_send floats at device pointer send_buf to dest while receiving n_recv floats from
  /// src into recv_buf; returns when both are complete.
  virtual void sendrecv(const float* send_buf, int64_t n_send, int dest, float* recv_buf,
                        int64_t n_recv, int src) = 0;
  /// In-place sum over ranks of n floats.
  virtual void all_reduce(float* buf, int64_t n) = 0;
  /// in: world_size * n floats, out: n floats (block r of the sum lands on rank r).
  virtual void reduce_scatter(const float* in, float* out, int64_t n) = 0;
  /// in: n floats, out: world_size * n floats (block r from rank r). in may be out + rank * n.
  virtual void all_gather(const float* in, float* out, int64_t n) = 0;
  virtual void broadcast(float* buf, int64_t n, int root) = 0;
  /// Collectives that may return before they complete (NCCL: queued on the communication
  /// stream once the kernels queued so far, which write their input, are done); they return a
  /// ticket (1, 2, ...) for wait(). The defaults run the blocking call. Their buffers must stay
  /// untouched until waited for. What DDP's bucket all-reduce overlapping backward and ZeRO-3's
  /// prefetch use. Ticket 0 stands for a collective that was blocking (chapter 04's ring):
  /// waiting for it does nothing.
  virtual int64_t all_reduce_async(float* buf, int64_t n) {
    all_reduce(buf, n);
    return issue_ticket();
  }
  virtual int64_t reduce_scatter_async(const float* in, float* out, int64_t n) {
    reduce_scatter(in, out, n);
    return issue_ticket();
  }
  virtual int64_t all_gather_async(const float* in, float* out, int64_t n) {
    all_gather(in, out, n);
    return issue_ticket();
  }
  /// Orders the compute stream after async collective `ticket` (the host does not block):
  /// kernels queued from now on see its result. Errors: a ticket never issued.
  virtual void wait(int64_t ticket) { check_ticket(ticket); }
  /// wait() for every async collective queued so far.
  virtual void wait_async() {}
  /// true when the async collectives can overlap the compute stream (NCCL), false when they
  /// are blocking calls.
  virtual bool overlaps() const { return false; }
  /// "nccl".
  virtual std::string transport() const = 0;

  // What chapter 04's ring template uses (the same names as Communicator's).
  void sendrecv(std::span<const float> send_buf, int dest, std::span<float> recv_buf, int src) {
    sendrecv(send_buf.data(), static_cast<int64_t>(send_buf.size()), dest, recv_buf.data(),
             static_cast<int64_t>(recv_buf.size()), src);
  }
  void count_call(const std::string& op) { host_.count_call(op); }
  /// Attributes the traffic of its lifetime to `op` (Communicator::Scope on the host counters).
  class Scope : public Communicator::Scope {
   public:
    Scope(DeviceComm& comm, std::string op) : Communicator::Scope(comm.host(), std::move(op)) {}
  };
  /// --trace: while a clock is set, every call records a DeviceSpan of marks on the stream it
  /// runs on (null: stop).
  void set_clock(DeviceClock* clock) { clock_ = clock; }
  /// The spans recorded since the last take_spans().
  std::vector<DeviceSpan> take_spans() { return std::exchange(spans_, {}); }
  /// Per operation: calls, messages and bytes (the host Communicator's counters()).
  const std::map<std::string, Communicator::Counters>& counters() const {
    return host_.counters();
  }

 protected:
  /// The next ticket (1, 2, ...), and the check that `ticket` is 0 or was issued.
  int64_t issue_ticket() { return ++tickets_; }
  int64_t tickets() const { return tickets_; }
  void check_ticket(int64_t ticket) const {
    RZ_CHECK(ticket >= 0 && ticket <= tickets_, "wait: ticket " << ticket << " was never issued");
  }
  /// Implementations call these around each call they queue: a mark on `stream` before (-1
  /// without a clock) and the span after.
  int begin_span(void* stream) { return clock_ ? clock_->mark(stream) : -1; }
  void end_span(const char* op, int begin, void* stream) {
    if (begin < 0) return;
    const std::string& scope = host_.scope();
    spans_.push_back({scope.empty() ? op : scope, begin, clock_->mark(stream)});
  }

 private:
  Communicator& host_;
  DeviceClock* clock_ = nullptr;
  std::vector<DeviceSpan> spans_;
  int64_t tickets_ = 0;  // the last ticket issued
};

}  // namespace ringzero
