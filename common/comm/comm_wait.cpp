// comm_wait: how the communicator waits, internal to common/comm/ (mpi_stage.hpp declares it):
// for posted requests (complete), for a message to arrive (wait_for_message) and for every rank
// to reach a collective (wait_for_peers). The step's thread blocks in MPI; a communication
// thread (Communicator::set_wait_sleep_us_this_thread) tests and sleeps instead, so the thread
// computing beside it keeps its core, and gives up when its rank is stopping at an error
// (Communicator::set_abandon_flag_this_thread); wait_until waits the same way for what a device
// transport queued.
#include <mpi.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "common/comm/comm.hpp"
#include "common/comm/mpi_stage.hpp"
#include "common/core/check.hpp"
#include "common/core/step_time.hpp"

namespace ringzero {

namespace {
thread_local int wait_sleep_us = 0;  // see Communicator::set_wait_sleep_us_this_thread
thread_local const std::atomic<bool>* abandon_flag = nullptr;  // set_abandon_flag_this_thread

// A communication thread's wait (wait_sleep_us > 0): calls `done` (an MPI test, which also makes
// progress) until it is true, sleeping between calls; gives up, naming the wait (`what()`), when
// this rank is stopping at an error.
template <class Done, class What>
void poll(Done done, What what) {
  while (!done()) {
    RZ_CHECK(abandon_flag == nullptr || !abandon_flag->load(),
             what() << " abandoned: this rank is stopping at an error");
    std::this_thread::sleep_for(std::chrono::microseconds(wait_sleep_us));
  }
}
}  // namespace

void Communicator::set_abandon_flag_this_thread(const std::atomic<bool>* flag) {
  abandon_flag = flag;
}

void Communicator::wait_until(const std::function<bool()>& done,
                              const std::function<std::string()>& what) {
  poll(done, what);
}

void Communicator::set_wait_sleep_us_this_thread(int us) {
  RZ_CHECK(us >= 0, "wait sleep " << us << " us must be >= 0");
  wait_sleep_us = us;
}

namespace comm_detail {

void cancel_requests(std::vector<MPI_Request>& requests) {
  for (MPI_Request& r : requests) {
    if (r == MPI_REQUEST_NULL) continue;
    MPI_Cancel(&r);
    MPI_Request_free(&r);
  }
}

void complete(std::vector<MPI_Request>& requests, int dest, int src) {
  if (wait_sleep_us == 0) {
    MPI_CALL(MPI_Waitall(static_cast<int>(requests.size()), requests.data(), MPI_STATUSES_IGNORE));
    return;
  }
  // Each MPI_Testall also makes progress (copies data, answers handshakes); sleeping between
  // tests gives the core back to the thread computing beside this one.
  int done = 0;
  const auto all_done = [&] {
    MPI_CALL(MPI_Testall(static_cast<int>(requests.size()), requests.data(), &done,
                         MPI_STATUSES_IGNORE));
    return done != 0;
  };
  try {
    poll(all_done, [&] {
      return "sendrecv with ranks " + std::to_string(dest) + " and " + std::to_string(src);
    });
  } catch (...) {
    cancel_requests(requests);  // receive nothing more into buffers about to be freed
    throw;
  }
}

void wait_for_message(int src) {
  const PeerWaitScope wait;
  if (wait_sleep_us == 0) {
    MPI_CALL(MPI_Probe(src, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE));
    return;
  }
  int there = 0;
  const auto arrived = [&] {
    MPI_CALL(MPI_Iprobe(src, 0, MPI_COMM_WORLD, &there, MPI_STATUS_IGNORE));
    return there != 0;
  };
  poll(arrived, [&] { return "receive from rank " + std::to_string(src); });
}

void wait_for_peers() {
  if (!PeerWaits::enabled()) return;
  const PeerWaitScope wait;
  MPI_Request request;
  MPI_CALL(MPI_Ibarrier(MPI_COMM_WORLD, &request));
  if (wait_sleep_us == 0) {
    MPI_CALL(MPI_Wait(&request, MPI_STATUS_IGNORE));
    return;
  }
  int done = 0;
  const auto all_there = [&] {
    MPI_CALL(MPI_Test(&request, &done, MPI_STATUS_IGNORE));
    return done != 0;
  };
  poll(all_there, [] { return std::string("wait for every rank before a collective"); });
}

}  // namespace comm_detail

}  // namespace ringzero
