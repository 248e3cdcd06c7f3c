// WatchedComm: the communicator the coursework graders run a student's point-to-point
// collective over (grade_ch03: the central reducer, grade_ch04: the ring). A collective that
// never completes (a send without its receive, the wrong neighbour, a step too many) is the
// most common mistake there, and under mpirun it hangs silently; here every rank stops within
// GRADE_HANG_SECONDS (default 10) and prints where it is: the collective, the length n, the
// message or step, and what it sends and awaits. An MPI error (a message longer than the
// buffer awaiting it) is named at the call that made it.
#pragma once

#include <mpi.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <span>
#include <string>
#include <thread>
#include <type_traits>

#include "common/comm/comm.hpp"

namespace grade {

/// The communicator a grader runs the student's collective over: Communicator's rank,
/// world_size, count_call, Scope, send, recv and sendrecv (the templates of chapter 03's
/// central_reducer.hpp and chapter 04's ring.hpp), on MPI_COMM_WORLD, with a deadline. A check
/// starts with begin() (every rank, a barrier: the deadline is the same on all) and ends with
/// end(); a message still waited for at the deadline prints this rank's place and aborts.
/// float and bf16 (the graders' values); counts the bytes itself.
class WatchedComm {
 public:
  struct Scope {
    Scope(WatchedComm&, const char*) {}
  };
  /// What the grader's messages say besides the place: `hang` why a message may not come,
  /// `mismatch` why an MPI call may fail (a message of the wrong length), `chunks` whether a
  /// span of the check's buffer is named by its ring chunk (chapter 04) or by its elements.
  struct Hints {
    std::string hang, mismatch;
    bool chunks = false;
  };
  WatchedComm(const ringzero::Communicator& comm, Hints hints)
      : rank_(comm.rank()), size_(comm.world_size()), hints_(std::move(hints)) {
    const char* s = std::getenv("GRADE_HANG_SECONDS");
    hang_seconds_ = s != nullptr ? std::atof(s) : 10.0;
    if (!(hang_seconds_ >= 1)) hang_seconds_ = 10.0;  // unset, not a number, or below 1 s
  }
  int rank() const { return rank_; }
  int world_size() const { return size_; }
  void count_call(const char* op) { op_ = op; }

  /// Starts a check on the buffer `base` of n elements of `element_bytes` each (a hop's chunk
  /// is named by its place in it); resets the byte counts.
  void begin(const void* base, int64_t n, int64_t element_bytes) {
    base_ = static_cast<const char*>(base);
    n_ = n;
    element_bytes_ = element_bytes;
    hop_ = 0;
    ++tag_;  // each check its own tag: a stray message of one never matches the next
    bytes_sent = bytes_received = 0;
    op_ = "(no collective yet)";
    MPI_Barrier(MPI_COMM_WORLD);
    deadline_ = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                   std::chrono::duration<double>(hang_seconds_));
  }
  /// Ends a check: waits, under the same deadline, for every rank to end it too.
  void end() {
    MPI_Request request = MPI_REQUEST_NULL;
    const std::string where = "finished " + op_ + ", waiting for the other ranks to finish it";
    report_error(MPI_Ibarrier(MPI_COMM_WORLD, &request), where);
    watch(&request, 1, where);
  }

  /// One message to `dest`, watched (a send may wait for its receiver). T: float or bf16.
  template <class T>
  void send(std::span<T> buf, int dest) {
    using E = std::remove_const_t<T>;
    bytes_sent += message(true, const_cast<E*>(buf.data()), buf.size_bytes(), sizeof(E), dest,
                          span_name(std::span<const E>(buf)));
  }
  /// One message from `src` into `buf`, watched.
  template <class T>
  void recv(std::span<T> buf, int src) {
    bytes_received += message(false, buf.data(), buf.size_bytes(), sizeof(T), src,
                              span_name(std::span<const T>(buf)));
  }

  template <class T>
  void sendrecv(std::span<const T> send, int dest, std::span<T> recv, int src) {
    ++hop_;
    const std::string where = op_ + ", step " + std::to_string(hop_) + ": sending " +
                              span_name(send) + " to rank " + std::to_string(dest) + ", awaiting " +
                              span_name(std::span<const T>(recv)) + " from rank " +
                              std::to_string(src);
    MPI_Request requests[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};
    report_error(MPI_Irecv(recv.data(), static_cast<int>(recv.size_bytes()), MPI_BYTE, src, tag_,
                           MPI_COMM_WORLD, &requests[0]),
                 where);
    report_error(MPI_Isend(send.data(), static_cast<int>(send.size_bytes()), MPI_BYTE, dest, tag_,
                           MPI_COMM_WORLD, &requests[1]),
                 where);
    bytes_received += watch(requests, 2, where, recv.size_bytes(), sizeof(T));
    bytes_sent += static_cast<int64_t>(send.size_bytes());
  }

  int64_t bytes_sent = 0, bytes_received = 0;

 private:
  using Clock = std::chrono::steady_clock;

  // "4 elements, chunk 1 ([4, 8))" when the span lies in the check's buffer, else "3 elements
  // (into the scratch)".
  template <class T>
  std::string span_name(std::span<const T> s) const {
    const std::string count = std::to_string(s.size()) + " elements";
    const auto at = reinterpret_cast<const char*>(s.data()) - base_;
    if (base_ == nullptr || at < 0 || at >= n_ * element_bytes_ || s.empty())
      return count + (s.empty() ? "" : " (into the scratch)");
    const int64_t first = at / element_bytes_, chunk = (n_ + size_ - 1) / size_;
    if (!hints_.chunks)
      return count + " ([" + std::to_string(first) + ", " +
             std::to_string(first + static_cast<int64_t>(s.size())) + ") of the buffer)";
    return count + ", chunk " + std::to_string(first / chunk) + " ([" + std::to_string(first) +
           ", " + std::to_string(first + static_cast<int64_t>(s.size())) + "))";
  }

  // One watched message of `bytes` to (sending) or from `peer`, `what` naming the span; returns
  // the bytes it moved.
  int64_t message(bool sending, void* data, size_t bytes, size_t element_bytes, int peer,
                  const std::string& what) {
    const std::string where = op_ + ", message " + std::to_string(++hop_) +
                              (sending ? ": sending " : ": awaiting ") + what +
                              (sending ? " to rank " : " from rank ") + std::to_string(peer);
    MPI_Request request = MPI_REQUEST_NULL;
    const int n = static_cast<int>(bytes);
    report_error(sending ? MPI_Isend(data, n, MPI_BYTE, peer, tag_, MPI_COMM_WORLD, &request)
                         : MPI_Irecv(data, n, MPI_BYTE, peer, tag_, MPI_COMM_WORLD, &request),
                 where);
    const int64_t got = watch(&request, 1, where, sending ? 0 : bytes, element_bytes);
    return sending ? static_cast<int64_t>(bytes) : got;
  }

  // Waits for `requests` until the deadline; past it, prints where this rank is and aborts
  // (every stuck rank reaches the same deadline and prints before the first abort lands).
  // requests[0] a receive of `awaited` bytes: returns the bytes it got, and stops, located, on a
  // shorter message (MPI accepts one silently; the rest of the buffer would keep stale values).
  int64_t watch(MPI_Request* requests, int count, const std::string& where, size_t awaited = 0,
                size_t element_bytes = 1) {
    int done = 0;
    MPI_Status statuses[2];
    while (!done) {
      const int rc = MPI_Testall(count, requests, &done, statuses);
      if (rc == MPI_ERR_IN_STATUS)
        for (int i = 0; i < count; ++i) report_error(statuses[i].MPI_ERROR, where);
      report_error(rc, where);
      if (done) break;
      if (Clock::now() > deadline_)
        stop("no answer within " + std::to_string(static_cast<int>(hang_seconds_)) + " s", where,
             hints_.hang);
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
    if (awaited == 0) return 0;
    int got = 0;
    MPI_Get_count(&statuses[0], MPI_BYTE, &got);
    if (static_cast<size_t>(got) != awaited)
      stop("a message of " + std::to_string(got / element_bytes) + " elements where " +
               std::to_string(awaited / element_bytes) + " were awaited",
           where, hints_.mismatch);
    return got;
  }
  // An MPI call that failed (the communicator returns errors: common/comm/comm.cpp): a message
  // longer than the chunk awaited (MPI_ERR_TRUNCATE), a rank out of range. Stops, located.
  void report_error(int rc, const std::string& where) {
    if (rc == MPI_SUCCESS || rc == MPI_ERR_PENDING) return;
    char text[MPI_MAX_ERROR_STRING];
    int length = 0;
    MPI_Error_string(rc, text, &length);
    stop(std::string("MPI error (") + text + ")", where, hints_.mismatch);
  }
  [[noreturn]] void stop(const std::string& what, const std::string& where,
                         const std::string& why) {
    std::fprintf(stderr, "[rank %d/%d] %s: n = %lld, %s %s\n", rank_, size_, what.c_str(),
                 static_cast<long long>(n_), where.c_str(), why.c_str());
    std::fflush(stderr);
    std::this_thread::sleep_for(std::chrono::seconds(1));  // let the other ranks print
    MPI_Abort(MPI_COMM_WORLD, 3);
    std::abort();
  }

  int rank_, size_;
  Hints hints_;
  int tag_ = 404;
  double hang_seconds_;
  std::string op_ = "(no collective yet)";
  int hop_ = 0;
  const char* base_ = nullptr;
  int64_t n_ = 0, element_bytes_ = 4;
  Clock::time_point deadline_{};
};

}  // namespace grade
