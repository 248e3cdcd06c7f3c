// CommThread's pinning (RINGZERO_COMM_CPUS, common/comm/comm_thread.hpp): the communication thread
// runs on the CPUs named, the main thread keeps its own, and a bad list is refused at once.
// No MPI: the jobs below make no MPI call.
#include <sched.h>

#include <cstdlib>

#include "common/comm/comm_thread.hpp"

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

TEST_CASE("RINGZERO_COMM_CPUS takes ranges as taskset writes them", "[comm_thread]") {
  const cpu_set_t mine = affinity_of_this_thread();
  int first = 0;
  while (!CPU_ISSET(first, &mine)) ++first;  // our lowest CPU
  const std::string c = std::to_string(first);
  CommCpus env((c + "-" + c + "," + c).c_str());  // a range of one and the same CPU again
  cpu_set_t in_job;
  CPU_ZERO(&in_job);
  {
    CommThread thread;
    thread.wait(thread.submit([&] { in_job = affinity_of_this_thread(); }));
  }
  REQUIRE(CPU_COUNT(&in_job) == 1);
  REQUIRE(CPU_ISSET(first, &in_job));
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
  // Every item must be there, digits only: no empty item at either end or between, no sign,
  // no blank (strtol would take " 1" and "+1" and stop at "1 ").
  for (const char* bad : {"1,,2", "1,", ",1", " 1", "1 ", "+1", "0x1", "1-", "-1-2"}) {
    CommCpus env(bad);
    REQUIRE_THROWS_WITH(CommThread(), Contains("is not a CPU number or range"));
  }
  {
    CommCpus env("99999");
    REQUIRE_THROWS_WITH(CommThread(), Contains("CPU 99999 is beyond the 1024 CPUs"));
  }
  {
    CommCpus env("3-1");
    REQUIRE_THROWS_WITH(CommThread(), Contains("range '3-1' runs backwards"));
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
    REQUIRE_THROWS_WITH(thread.wait(thread.submit([] {})),
                        Contains("RINGZERO_COMM_CPUS='1000': this machine refuses that CPU set"));
  }
}
