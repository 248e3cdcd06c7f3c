// Catch2 runner for tests under mpirun: MPI is initialised once, by the Communicator every
// test shares (test_comm()), and finalised after the last test. A failing REQUIRE on one rank
// makes that rank exit non-zero; ranks waiting for it in a collective are stopped by mpirun.
// A hang is located, not just timed out: a watchdog thread stops every rank whose test case
// has run for RINGZERO_TEST_HANG_SECONDS (default 60; every case here takes seconds), each
// printing its rank, the test case, the collective its communicator was in (the open Scope:
// ring_reduce_scatter, ring_all_gather, central_reduce, ...) and the point-to-point traffic
// counted so far per operation, then MPI_Abort. These tests are also the coursework graders
// of chapters 05-08 (scripts/exercise check), where a hang is a student's most common fault.
#define CATCH_CONFIG_RUNNER
#define CATCH_CONFIG_CONSOLE_WIDTH 200  // long failure reports stay on one line
#include <catch2/catch.hpp>

#include <mpi.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <thread>

#include "mpi/test_comm.hpp"

ringzero::Communicator* g_test_comm = nullptr;
ringzero::Communicator& test_comm() {
  return *g_test_comm;
}

namespace {

using Clock = std::chrono::steady_clock;

// The running test case, as the listener below reports it to the watchdog.
struct Running {
  std::mutex mutex;
  std::string name;  // "" between test cases
  Clock::time_point since;
} g_running;

struct HangListener : Catch::TestEventListenerBase {
  using TestEventListenerBase::TestEventListenerBase;
  void testCaseStarting(const Catch::TestCaseInfo& info) override {
    const std::lock_guard lock(g_running.mutex);
    g_running.name = info.name;
    g_running.since = Clock::now();
  }
  void testCaseEnded(const Catch::TestCaseStats&) override {
    const std::lock_guard lock(g_running.mutex);
    g_running.name.clear();
  }
};

// Prints where this rank is and stops the job (read at the moment of the hang: the threads that
// write the communicator's scope and counters are the ones stuck).
[[noreturn]] void stop_hung(const std::string& test_case, double seconds) {
  const ringzero::Communicator& comm = test_comm();
  std::string traffic;
  for (const auto& [op, c] : comm.counters())
    traffic += " " + op + " (" + std::to_string(c.calls) + " calls, " +
               std::to_string(c.bytes_sent) + " B sent, " + std::to_string(c.bytes_received) +
               " B received)";
  std::fprintf(
      stderr,
      "[rank %d/%d] test case \"%s\" has not finished after %.0f s: a hang (ranks "
      "waiting for a message that never comes). In collective: %s. Counted so far:%s\n",
      comm.rank(), comm.world_size(), test_case.c_str(), seconds,
      comm.scope().empty() ? "none (a point-to-point call or a wait)" : comm.scope().c_str(),
      traffic.empty() ? " nothing" : traffic.c_str());
  std::fflush(stderr);
  std::this_thread::sleep_for(std::chrono::seconds(1));  // let the other ranks print
  MPI_Abort(MPI_COMM_WORLD, 4);
  std::abort();
}

}  // namespace

CATCH_REGISTER_LISTENER(HangListener)

int main(int argc, char** argv) {
  ringzero::Communicator comm(argc, argv);
  g_test_comm = &comm;
  const char* env = std::getenv("RINGZERO_TEST_HANG_SECONDS");
  const double limit = env != nullptr && std::atof(env) > 0 ? std::atof(env) : 60.0;
  std::atomic<bool> done{false};
  std::thread watchdog([&] {
    while (!done) {
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      std::string name;
      double seconds = 0;
      {
        const std::lock_guard lock(g_running.mutex);
        if (g_running.name.empty()) continue;
        name = g_running.name;
        seconds = std::chrono::duration<double>(Clock::now() - g_running.since).count();
      }
      if (seconds > limit) stop_hung(name, seconds);
    }
  });
  const int rc = Catch::Session().run(argc, argv);
  done = true;
  watchdog.join();
  return rc;
}
