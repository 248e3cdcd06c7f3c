#include "comm_thread.hpp"

#include <chrono>
#include <utility>

#include "check.hpp"

#include "comm.hpp"

namespace ringzero {

CommThread::CommThread(int wait_sleep_us)
    : thread_([this, wait_sleep_us] {
        Communicator::set_wait_sleep_us_this_thread(wait_sleep_us);
        Communicator::set_abandon_flag_this_thread(&abandon_);
        run();
      }) {}

CommThread::~CommThread() {
  bool busy = false;
  {
    std::unique_lock<std::mutex> lock(mutex_);
    if (std::uncaught_exceptions() == 0) {
      done_cv_.wait(lock, [this] { return finished_ == submitted_; });
    }
    queue_.clear();  // not started: nobody waits for them any more
    stop_ = true;
    if (busy_) {
      // Unwinding (an error on this rank) while a job waits in MPI, perhaps for a rank that has
      // failed: it gives up, and the thread is joined before the owner's buffers are freed.
      abandon_ = true;
      busy = !done_cv_.wait_for(lock, std::chrono::seconds(2), [this] { return !busy_; });
    }
  }
  work_cv_.notify_one();
  if (busy)
    thread_.detach();  // blocked where it cannot give up: run_main's MPI_Abort ends it
  else
    thread_.join();
}

uint64_t CommThread::submit(std::function<void()> job) {
  uint64_t ticket = 0;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    rethrow_locked();
    queue_.push_back(std::move(job));
    ticket = ++submitted_;
  }
  work_cv_.notify_one();
  return ticket;
}

void CommThread::wait(uint64_t ticket) {
  std::unique_lock<std::mutex> lock(mutex_);
  done_cv_.wait(lock, [&] { return finished_ >= ticket || error_; });
  rethrow_locked();
  RZ_CHECK(ticket > skip_through_ || ticket <= skipped_before_,
           "communication job " << ticket << " was not run: an earlier one failed (its error "
                                << "is above); this rank is out of step with the others");
}

bool CommThread::idle() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return finished_ == submitted_;
}

void CommThread::rethrow_locked() {
  if (error_) {
    std::exception_ptr e = std::exchange(error_, nullptr);
    std::rethrow_exception(e);
  }
}

void CommThread::run() {
  std::unique_lock<std::mutex> lock(mutex_);
  while (true) {
    work_cv_.wait(lock, [this] { return stop_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stop_ and nothing left
    std::function<void()> job = std::move(queue_.front());
    queue_.pop_front();
    if (finished_ + 1 <= skip_through_) {  // queued behind a failed job: drop it
      ++finished_;
      done_cv_.notify_all();
      continue;
    }
    busy_ = true;
    lock.unlock();
    std::exception_ptr error;
    try {
      job();
    } catch (...) {
      error = std::current_exception();
    }
    lock.lock();
    busy_ = false;
    if (error) {
      if (!error_) error_ = error;
      skipped_before_ = finished_ + 1;  // this one failed; the ones queued behind it are dropped
      skip_through_ = submitted_;
    }
    ++finished_;
    done_cv_.notify_all();
  }
}

}  // namespace ringzero
