#include "common/comm/comm_thread.hpp"

#include <pthread.h>
#include <sched.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>

#include "common/core/check.hpp"

#include "common/comm/comm.hpp"
#include "common/core/device_backend.hpp"

namespace ringzero {

namespace {

// RINGZERO_COMM_CPUS (see comm_thread.hpp): the CPUs the thread may run on, parsed before the
// thread starts (a bad value throws from the constructor, with no thread to join). Unset: empty.
cpu_set_t comm_cpus_from_env() {
  cpu_set_t set;
  CPU_ZERO(&set);
  const char* text = std::getenv("RINGZERO_COMM_CPUS");
  if (text == nullptr) return set;
  const std::string list = text;
  RZ_CHECK(!list.empty(), "RINGZERO_COMM_CPUS is set but empty; give a CPU such as 1, or unset it");
  // A CPU number: digits only (no sign, no blanks), below CPU_SETSIZE.
  auto cpu_of = [&](const std::string& digits, const std::string& item) {
    RZ_CHECK(!digits.empty() && digits.find_first_not_of("0123456789") == std::string::npos,
             "RINGZERO_COMM_CPUS='" << list << "': '" << item << "' is not a CPU number or "
                                    << "range; give a list such as 1, 2,3 or 0-3, or unset it");
    RZ_CHECK(digits.size() <= 4 && std::stoi(digits) < CPU_SETSIZE,
             "RINGZERO_COMM_CPUS='" << list << "': CPU " << digits << " is beyond the "
                                    << CPU_SETSIZE << " CPUs a CPU set can name; name CPUs that "
                                    << "exist (0 to nproc - 1)");
    return std::stoi(digits);
  };
  size_t start = 0;
  while (true) {  // items between commas; every one must be there ("1," and ",1" are refused)
    const size_t comma = list.find(',', start);
    const std::string item = list.substr(start, comma == std::string::npos ? comma : comma - start);
    const size_t dash = item.find('-');
    const int first = cpu_of(item.substr(0, dash), item);
    const int last = dash == std::string::npos ? first : cpu_of(item.substr(dash + 1), item);
    RZ_CHECK(first <= last, "RINGZERO_COMM_CPUS='" << list << "': range '" << item
                                                   << "' runs backwards; write it low-high");
    for (int cpu = first; cpu <= last; ++cpu) CPU_SET(cpu, &set);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return set;
}

}  // namespace

CommThread::CommThread(int wait_sleep_us)
    : thread_([this, wait_sleep_us, cpus = comm_cpus_from_env()] {
        if (CPU_COUNT(&cpus) > 0) {
          int rc = pthread_setaffinity_np(pthread_self(), sizeof(cpus), &cpus);
          try {  // reported by the first submit() or wait(), like a failed job
            RZ_CHECK(rc == 0, "RINGZERO_COMM_CPUS='"
                                  << std::getenv("RINGZERO_COMM_CPUS")
                                  << "': this machine refuses that CPU set (" << std::strerror(rc)
                                  << "); name CPUs that exist (0 to nproc - 1), or unset it");
          } catch (...) {
            std::lock_guard<std::mutex> lock(mutex_);
            error_ = std::current_exception();
          }
        }
        Communicator::set_wait_sleep_us_this_thread(wait_sleep_us);
        Communicator::set_abandon_flag_this_thread(&abandon_);
        run();
      }) {}

CommThread::~CommThread() { stop(); }

void CommThread::stop() {
  if (!thread_.joinable()) return;  // stopped already
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
    // On a GPU (see the top of comm_thread.hpp): after what this thread queued, done when done.
    queue_.push_back([mark = mark_device_work(), job = std::move(job)] {
      wait_for_device_work(mark);
      job();
      finish_device_work();
    });
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
