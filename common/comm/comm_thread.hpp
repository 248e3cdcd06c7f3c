// comm_thread: a dedicated communication thread that runs jobs one at a time, in the order
// they were submitted, while the main thread computes.
//
// Provides: CommThread — submit() queues a job (a closure that makes MPI calls) and returns a
// ticket; wait(ticket) blocks until that job and every earlier one have finished; wait_all()
// drains the queue. An exception thrown by a job is kept and rethrown by the next submit() or
// wait() on the main thread, so run_main turns it into MPI_Abort as usual. The jobs queued
// behind a failed one are not run (they would pair this rank's next collective with another
// rank's different one); waiting for one of them throws.
//
// Errors and unwinding: when an exception unwinds through the owner (a DDP, a ZeRO) while a
// job is still blocked in MPI (on a rank that has failed), the destructor tells the job to give
// up (its sendrecv cancels its receives and throws, see Communicator::
// set_abandon_flag_this_thread) and joins the thread BEFORE the owner's buffers are freed, so
// the thread never touches freed memory. A job blocked where it cannot look (an MPI
// collective of --collectives mpi) is detached after 2 s: run_main's MPI_Abort ends it.
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
//
// On a GPU (--device cuda) the thread queues its kernels and copies (the ring's adds, a staged
// message's copies) on a CUDA stream of its own, and NCCL's stream waits for that one: they run
// beside the backward's kernels, which the step's thread queues on its stream. A job's stream
// work starts after everything the submitting thread had queued when it called submit() (an
// event recorded there: DDP's bucket of gradients is complete), and the job is finished only
// when its stream work is, so a wait() that returns leaves nothing of it running
// (common/core/device_backend.hpp's mark_device_work). On the host nothing of this happens.
//
// Pinning (an emulated node's network engine): with RINGZERO_COMM_CPUS=1 in the environment
// the thread runs only on CPU 1 (a list such as 2,3 or 0-3 names several), while the rank's main
// thread keeps the CPUs it was started on. `scripts/cluster up --comm-core` uses it to give the
// emulated nodes' communication one core of the machine and their computation the others, as a real
// node's NIC moves bytes while its cores (or GPU) compute. A bad list is an error at start-up.
// Leaves out: priorities, cancelling a submitted job, more than one communication thread.
#pragma once

#include <atomic>
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
  /// Waits for the queued jobs and joins. If an exception is unwinding through the caller, the
  /// queued jobs are dropped, a running one is told to give up, and the thread is joined (see
  /// the top of this file; detached only if the job does not stop within 2 s).
  ~CommThread();
  /// What the destructor does, now (for an owner whose buffers the jobs write and that dies
  /// before this thread); after it, nothing may be submitted. Calling it again does nothing.
  void stop();
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
  uint64_t submitted_ = 0;       // written by the main thread only, under mutex_
  uint64_t finished_ = 0;        // guarded by mutex_
  uint64_t skipped_before_ = 0;  // the ticket of the last job that failed
  uint64_t skip_through_ = 0;    // jobs after it, up to this ticket, are dropped
  bool busy_ = false;            // a job is running (guarded by mutex_)
  bool stop_ = false;
  std::atomic<bool> abandon_{false};  // the running job's sendrecv gives up (destructor only)
  std::exception_ptr error_;
  std::thread thread_;  // last: started after every member above exists
};

}  // namespace ringzero
