// comm: a thin communicator over MPI, with byte and message counters.
//
// Provides: Communicator — rank, world_size, local_rank; send, recv, sendrecv; broadcast,
// reduce, all_reduce, reduce_scatter, all_gather (sums over float32), barrier; small helpers
// for metrics (double sums, gathering strings). Element counts are 64-bit and split into
// pieces of at most INT_MAX elements per MPI call (split_count). Every MPI error becomes a
// RZ_CHECK failure, which run_main turns into MPI_Abort of every rank: never a hang.
//
// Counters: per operation name, this rank's calls, messages and bytes sent and received.
// Point-to-point calls count exactly what they move. A Scope relabels the point-to-point
// traffic inside it (chapter 04's ring counts as "ring_all_reduce", not "sendrecv"). For
// collectives MPI implements internally, the wire traffic is invisible to us: the counters
// record the payload handed to MPI (the send buffer as sent, the result as received).
// Metrics traffic (loss and accuracy sums, reports) is counted under "metrics" so that
// per-step gradient traffic can be compared with theory exactly.
// Device buffers: with a DeviceTransport set (NCCL, device_transport.hpp) a message whose
// buffers live on its device goes through it; without one, it is staged through host memory.
// Either way the counters count it as above.
// Leaves out: communicators other than MPI_COMM_WORLD, dtypes other than float32/float64
// (and bf16/fp16 values in send, recv and sendrecv).
#pragma once

#include <climits>
#include <atomic>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <map>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "common/comm/device_transport.hpp"
#include "common/core/half.hpp"

namespace ringzero {

/// [offset, offset + count) pieces covering [0, n), each count <= max_piece (the last may be
/// shorter). n = 0 gives no pieces. Errors: n < 0, max_piece <= 0.
std::vector<std::pair<int64_t, int64_t>> split_count(int64_t n, int64_t max_piece = INT_MAX);

class Communicator {
 public:
  struct Counters {
    int64_t calls = 0, messages_sent = 0, bytes_sent = 0, messages_received = 0, bytes_received = 0;
    /// Adds `other` field by field, times `sign` (-1: a difference from a snapshot).
    Counters& add(const Counters& other, int64_t sign = 1) {
      calls += sign * other.calls;
      messages_sent += sign * other.messages_sent;
      bytes_sent += sign * other.bytes_sent;
      messages_received += sign * other.messages_received;
      bytes_received += sign * other.bytes_received;
      return *this;
    }
  };

  /// Initialises MPI (requesting MPI_THREAD_MULTIPLE, requiring at least SERIALIZED, so one
  /// communication thread may drive MPI while the main thread computes) and sets the
  /// "[rank r/N]" prefix of error messages. One Communicator per process.
  Communicator(int& argc, char**& argv);
  ~Communicator();  ///< MPI_Finalize
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  int rank() const { return rank_; }
  int world_size() const { return world_size_; }
  int local_rank() const { return local_rank_; }  ///< rank among the processes of this node

  void send(std::span<const float> buf, int dest);
  void recv(std::span<float> buf, int src);
  /// The same for 16-bit values (bf16 or fp16 bits; MPI_UINT16_T, counted at 2 bytes each).
  void send(std::span<const uint16_t> buf, int dest);
  void recv(std::span<uint16_t> buf, int src);
  /// Sends to dest and receives from src at once (no deadlock in a ring).
  void sendrecv(std::span<const float> send_buf, int dest, std::span<float> recv_buf, int src);
  /// The same for 16-bit values (bf16 or fp16 bits; MPI_UINT16_T, counted at 2 bytes each).
  void sendrecv(std::span<const uint16_t> send_buf, int dest, std::span<uint16_t> recv_buf,
                int src);
  /// send, recv and sendrecv of bf16 / fp16 values (common/core/half.hpp): their bits, as above.
  template <Half T>
  void send(std::span<const T> buf, int dest) { send(as_bits(buf), dest); }
  template <Half T>
  void send(std::span<T> buf, int dest) { send(as_bits(std::span<const T>(buf)), dest); }
  template <Half T>
  void recv(std::span<T> buf, int src) { recv(as_bits(buf), src); }
  template <Half T>
  void sendrecv(std::span<const T> send_buf, int dest, std::span<T> recv_buf, int src) {
    sendrecv(as_bits(send_buf), dest, as_bits(recv_buf), src);
  }
  /// How the CALLING thread waits in sendrecv (thread_local): 0, the default, spins in
  /// MPI_Waitall, the fastest when the thread has a core to itself; us > 0 tests for completion
  /// and sleeps `us` microseconds between tests, so that a communication thread sharing a core
  /// with computation does not take the core away while it waits for a slower peer (a spinning
  /// MPI wait does; CommThread sets this for its own thread).
  static void set_wait_sleep_us_this_thread(int us);
  /// The CALLING thread's sendrecv gives up once *flag is true (null: never; thread_local):
  /// while it waits (with a wait sleep > 0) it cancels its receives, frees its requests and
  /// throws. CommThread sets it for its own thread, so that an error on the main thread can
  /// stop a job blocked on a rank that has failed before the job's buffers are freed.
  static void set_abandon_flag_this_thread(const std::atomic<bool>* flag);
  /// Waits, as the CALLING thread waits in sendrecv (above), until done() is true: for work a
  /// device transport queued (NCCL's stream, device_transport.hpp). Errors: the thread's abandon
  /// flag is set while it waits (naming what(), as sendrecv's do).
  static void wait_until(const std::function<bool()>& done,
                         const std::function<std::string()>& what);

  /// MPI_Bcast from root.
  void broadcast(std::span<float> buf, int root);
  /// MPI_Allreduce (sum), in place.
  void all_reduce(std::span<float> buf);
  /// MPI_Reduce_scatter_block (sum): in has world_size * out.size() elements; rank r gets the
  /// sum of every rank's block r.
  void reduce_scatter(std::span<const float> in, std::span<float> out);
  /// MPI_Allgather: out has world_size * in.size() elements, block r from rank r.
  void all_gather(std::span<const float> in, std::span<float> out);
  void barrier();

  /// Sum of values over ranks, in place (loss sums, accuracy counts); counted as "metrics".
  void all_reduce_metrics(std::span<double> values);
  /// Every rank's string, on root (others get {}); counted as "metrics".
  std::vector<std::string> gather_strings(const std::string& s, int root);
  /// root's string, on every rank; counted as "metrics".
  void broadcast_string(std::string& s, int root);

  /// Attributes the point-to-point traffic of its lifetime to `op`. Scopes do not nest.
  class Scope {
   public:
    Scope(Communicator& comm, std::string op)
        : comm_(comm), previous_(std::exchange(comm.scope_, std::move(op))) {}
    ~Scope() { comm_.scope_ = std::move(previous_); }
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    Communicator& comm_;
    std::string previous_;
  };

  const std::map<std::string, Counters>& counters() const { return counters_; }
  /// The op the open Scope attributes traffic to ("" when none is open).
  const std::string& scope() const { return scope_; }
  /// Sum over every operation except "metrics": the training traffic.
  Counters training_traffic() const;
  void reset_counters() { counters_.clear(); }
  /// Moves everything counted since `snapshot` (an earlier copy of counters()) under "metrics",
  /// so that training_traffic() stays the training steps' traffic; returns what it moved (the
  /// calls it moves stay counted as calls of "metrics"). For traffic outside a training step
  /// that is not metrics' own, e.g. chapter 08's evaluation, which all-gathers every layer.
  Counters recount_as_metrics(const std::map<std::string, Counters>& snapshot);
  /// Counts one call of `op` (used by the scope owner to count a whole collective as one call).
  void count_call(const std::string& op) { counters_[op].calls += 1; }
  /// Messages whose buffers all live on transport->device() go through it from now on (NCCL on
  /// a GPU, device_transport.hpp), counted as ever; null: every message through MPI, a device
  /// buffer staged through host memory. Not owned; set before any collective and cleared before
  /// it goes, on every rank alike.
  void set_device_transport(DeviceTransport* transport) { transport_ = transport; }
  /// The transport set, or null.
  DeviceTransport* device_transport() const { return transport_; }

 private:
  Counters& counter(const char* op);
  // The device transport when every non-empty buffer (pointer, elements) lives on its device.
  DeviceTransport* transport_for(
      std::initializer_list<std::pair<const void*, int64_t>> buffers) const;
  void send_raw(const void* data, int64_t n, int dest, int elem_bytes);
  void recv_raw(void* data, int64_t n, int src, int elem_bytes);
  void sendrecv_raw(const void* send_data, int64_t send_n, int dest, void* recv_data,
                    int64_t recv_n, int src, int elem_bytes);
  int rank_ = 0, world_size_ = 1, local_rank_ = 0;
  std::string scope_;
  std::map<std::string, Counters> counters_;
  DeviceTransport* transport_ = nullptr;
};

}  // namespace ringzero
