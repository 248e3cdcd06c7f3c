// CommThread's pinning (RINGZERO_COMM_CPUS, common/comm_thread.hpp): the communication thread
// runs on the CPUs named, the main thread keeps its own, and a bad list is refused at once.
// No MPI: the jobs below make no MPI call.
#include <sched.h>

#include <cstdlib>

#include "common/comm_thread.hpp"

#include <catch2/catch.hpp>

using namespace ringzero;
using Catch::Matchers::Contains;

namespace {
cpu_set_t affinity_of_this_thread() {
  cpu_set_t set;
  CPU_ZERO(&set);
  REQUIRE(sched_getaffinity(0, sizeof set, &set) == 0);
  return set;
}
// Sets RINGZERO_COMM_CPUS for one scope.
struct CommCpus {
  explicit CommCpus(const char* value) { setenv("RINGZERO_COMM_CPUS", value, 1); }
  ~CommCpus() { unsetenv("RINGZERO_COMM_CPUS"); }
};
}  // namespace

TEST_CASE("RINGZERO_COMM_CPUS pins the communication thread, not the main thread",
          "[comm_thread]") {
  const cpu_set_t main_before = affinity_of_this_thread();
  const int last = CPU_COUNT(&main_before) > 0 ? [&] {
    int cpu = 0;
    for (int c = 0; c < CPU_SETSIZE; ++c)
      if (CPU_ISSET(c, &main_before)) cpu = c;
    return cpu;
  }() : 0;
  const std::string value = std::to_string(last);
  CommCpus env(value.c_str());
  cpu_set_t in_job;
  CPU_ZERO(&in_job);
  {
    CommThread thread;
    thread.wait(thread.submit([&] { in_job = affinity_of_this_thread(); }));
  }
  REQUIRE(CPU_COUNT(&in_job) == 1);  // exactly the CPU named
  REQUIRE(CPU_ISSET(last, &in_job));
  const cpu_set_t main_after = affinity_of_this_thread();
  REQUIRE(CPU_EQUAL(&main_before, &main_after));  // the main thread keeps what it had
}

TEST_CASE("without RINGZERO_COMM_CPUS the thread inherits the main thread's CPUs",
          "[comm_thread]") {
  unsetenv("RINGZERO_COMM_CPUS");
  const cpu_set_t main_cpus = affinity_of_this_thread();
  cpu_set_t in_job;
  CPU_ZERO(&in_job);
  {
    CommThread thread;
    thread.wait(thread.submit([&] { in_job = affinity_of_this_thread(); }));
  }
  REQUIRE(CPU_EQUAL(&main_cpus, &in_job));
}

TEST_CASE("a bad RINGZERO_COMM_CPUS is refused before the thread starts", "[comm_thread]") {
  {
    CommCpus env("one");
    REQUIRE_THROWS_WITH(CommThread(), Contains("RINGZERO_COMM_CPUS='one': 'one' is not a CPU"));
  }
  {
    CommCpus env("1,,2");
    REQUIRE_THROWS_WITH(CommThread(), Contains("'' is not a CPU number"));
  }
  {
    CommCpus env("");
    REQUIRE_THROWS_WITH(CommThread(), Contains("set but empty"));
  }
  {
    CommCpus env("-3");
    REQUIRE_THROWS_WITH(CommThread(), Contains("'-3' is not a CPU number"));
  }
  {
    // A CPU this machine does not have: the affinity call fails in the thread; the first wait
    // reports it.
    CommCpus env("1000");
    CommThread thread;
    REQUIRE_THROWS_WITH(thread.wait(thread.submit([] {})), Contains("refuses that CPU set"));
  }
}
