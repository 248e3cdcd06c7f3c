#include "comm_thread.hpp"

#include <utility>

#include "comm.hpp"

namespace ringzero {

CommThread::CommThread(int wait_sleep_us)
    : thread_([this, wait_sleep_us] {
        Communicator::set_wait_sleep_us_this_thread(wait_sleep_us);
        run();
      }) {}

CommThread::~CommThread() {
  bool busy = false;
  {
    std::unique_lock<std::mutex> lock(mutex_);
    if (std::uncaught_exceptions() == 0) {
      done_cv_.wait(lock, [this] { return finished_ == submitted_; });
    }
    busy = finished_ != submitted_;
    queue_.clear();  // not started: nobody waits for them any more
    stop_ = true;
  }
  work_cv_.notify_one();
  if (busy)
    thread_.detach();  // only while unwinding to run_main's MPI_Abort
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
    lock.unlock();
    std::exception_ptr error;
    try {
      job();
    } catch (...) {
      error = std::current_exception();
    }
    lock.lock();
    if (error && !error_) error_ = error;
    ++finished_;
    done_cv_.notify_all();
  }
}

}  // namespace ringzero
