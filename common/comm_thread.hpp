// comm_thread: a dedicated communication thread that runs jobs one at a time, in the order
// they were submitted, while the main thread computes.
//
// Provides: CommThread — submit() queues a job (a closure that makes MPI calls) and returns a
// ticket; wait(ticket) blocks until that job and every earlier one have finished; wait_all()
// drains the queue. An exception thrown by a job is kept and rethrown by the next submit() or
// wait() on the main thread, so run_main turns it into MPI_Abort as usual.
//
// Why a thread and not MPI's non-blocking collectives: MPI_Iallreduce returns at once, but on
// most MPI builds (Open MPI over shared memory or TCP included) it only makes progress inside
// MPI calls, so a rank busy in a backward GEMM moves no bytes until it next enters MPI. A
// thread that sits inside MPI makes progress all the time, and runs exactly the same code
// (chapter 04's ring) as the synchronous version, so results stay bit for bit the same.
//
// The contract with MPI (initialised with at least MPI_THREAD_SERIALIZED): while a job is
// queued or running, the main thread makes NO MPI call and does not touch the Communicator
// (its counters are not synchronised); wait_all() hands MPI back to the main thread. Jobs run
// in FIFO order, so collectives are issued in the same order on every rank as long as every
// rank submits them in the same order. Jobs must not allocate Buffers (the memory ledger
// belongs to the main thread): give them preallocated storage.
//
// Waiting politely: an MPI wait spins at full speed. A communication thread that spins while
// its peer is still computing takes half the core from its own rank's backward whenever the
// two threads share a core (mpirun binds a rank to one core by default, and a 2-core machine
// has no core to spare anyway). So the thread waits in sendrecv by testing and sleeping
// (Communicator::set_wait_sleep_us_this_thread): a few tens of microseconds of latency per
// message, and the core stays with the computation. PyTorch's gloo backend gets the same from
// blocking socket reads.
// Leaves out: priorities, cancelling a submitted job, more than one communication thread.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>

namespace ringzero {

class CommThread {
 public:
  /// wait_sleep_us: how this thread waits in sendrecv (see above; 0 spins).
  explicit CommThread(int wait_sleep_us = kDefaultWaitSleepUs);
  static constexpr int kDefaultWaitSleepUs = 20;
  /// Waits for the queued jobs and joins. If an exception is unwinding through the caller
  /// while a job is still running (that job may wait forever for a rank that has failed), the
  /// thread is detached instead: the process is about to be aborted by run_main.
  ~CommThread();
  CommThread(const CommThread&) = delete;
  CommThread& operator=(const CommThread&) = delete;

  /// Queues `job`; returns its ticket (1, 2, 3, ... in submission order). Rethrows the error of
  /// an earlier job, if any.
  uint64_t submit(std::function<void()> job);
  /// Blocks until job `ticket` and every job before it have finished; rethrows a job's error.
  void wait(uint64_t ticket);
  /// Blocks until every submitted job has finished; rethrows a job's error.
  void wait_all() { wait(submitted_); }
  /// Whether every submitted job has finished (no MPI call is in flight on this thread).
  bool idle() const;

 private:
  void run();
  void rethrow_locked();

  mutable std::mutex mutex_;
  std::condition_variable work_cv_, done_cv_;
  std::deque<std::function<void()>> queue_;
  uint64_t submitted_ = 0;  // written by the main thread only, under mutex_
  uint64_t finished_ = 0;   // guarded by mutex_
  bool stop_ = false;
  std::exception_ptr error_;
  std::thread thread_;  // last: started after every member above exists
};

}  // namespace ringzero
