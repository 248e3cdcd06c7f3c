// Step-time attribution (common/core/step_time.hpp, common/report/attribution.hpp): the parts of
// a step add up to its wall-clock time, nested parts are exclusive, a disarmed clock and another
// thread's clock record nothing, --delay-rank's parser refuses what is not R:MS, and the late
// rank is the one the others wait for, and a peer wait recorded by another thread is claimed
// only where the step's thread waited. Sleeps are lower bounds only (a loaded machine makes them
// longer, never shorter), so every timed assertion is ">= the sleep" or a sum checked against
// the clock's own total.
#include <chrono>
#include <thread>

#include "common/report/attribution.hpp"

#include <catch2/catch.hpp>

using namespace ringzero;
using Catch::Matchers::Contains;

namespace {
void sleep_ms(int ms) { std::this_thread::sleep_for(std::chrono::milliseconds(ms)); }
}  // namespace

// Clocks arm only once --attribute enabled them (StepClock::set_enabled); each case turns them
// on and leaves them off.
struct ClocksOn {
  ClocksOn() { StepClock::set_enabled(true); }
  ~ClocksOn() { StepClock::set_enabled(false); }
};

TEST_CASE("without --attribute the clock never arms and reads nothing", "[attribution]") {
  REQUIRE_FALSE(StepClock::enabled());  // the default
  StepClock& clock = StepClock::this_thread();
  clock.start();
  REQUIRE_FALSE(clock.armed());
  {
    PartScope scope(StepPart::forward);
    sleep_ms(5);
  }
  REQUIRE(clock.stop().total_ms() == 0);
}

TEST_CASE("the parts are exclusive and sum to the step's wall-clock time", "[attribution]") {
  ClocksOn on;
  StepClock& clock = StepClock::this_thread();
  const auto t0 = std::chrono::steady_clock::now();
  clock.start();
  sleep_ms(5);  // other
  {
    PartScope optimizer(StepPart::optimizer);
    sleep_ms(5);
    {
      PartScope comm(StepPart::communication);  // nested: communication, not optimizer
      sleep_ms(20);
    }
    sleep_ms(5);
  }
  const StepParts parts = clock.stop();
  const double wall =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  REQUIRE(parts[StepPart::communication] >= 20);
  REQUIRE(parts[StepPart::optimizer] >= 10);
  REQUIRE(parts[StepPart::optimizer] < parts[StepPart::communication]);  // 10 vs 20 ms slept
  REQUIRE(parts[StepPart::other] >= 5);
  REQUIRE(parts[StepPart::forward] == 0);
  REQUIRE(parts[StepPart::backward] == 0);
  // The parts are cut from one clock: their sum is the time from start() to stop(), which lies
  // within the wall time measured around it (two clock reads apart: well under 1 ms).
  REQUIRE(parts.total_ms() <= wall);
  REQUIRE(parts.total_ms() >= wall - 1.0);
  REQUIRE_FALSE(clock.armed());
}

TEST_CASE("a disarmed clock and another thread's clock record nothing", "[attribution]") {
  ClocksOn on;
  StepClock& clock = StepClock::this_thread();
  {
    PartScope scope(StepPart::forward);  // before start(): a no-op, even when it ends later
    clock.start();
  }
  std::thread other([] {  // the communication thread: its own clock, never armed
    PartScope scope(StepPart::communication);
    REQUIRE_FALSE(StepClock::this_thread().armed());
    sleep_ms(20);
  });
  other.join();
  const StepParts parts = clock.stop();
  REQUIRE(parts[StepPart::forward] == 0);
  REQUIRE(parts[StepPart::communication] == 0);
  REQUIRE(parts[StepPart::other] >= 20);  // this thread waited for the other one: other
}

TEST_CASE("a peer wait on another thread is claimed where the step's thread waited",
          "[attribution]") {
  using Clock = StepClock::Clock;
  using std::chrono::milliseconds;
  ClocksOn on;  // and so the peer waits (PeerWaits::enabled)
  StepClock& clock = StepClock::this_thread();
  clock.start();
  const Clock::time_point t0 = Clock::now();
  // The communication thread waited for a peer over [t0, t0 + 30 ms] and [t0 + 50, t0 + 60]...
  PeerWaits::record(t0, t0 + milliseconds(30));
  PeerWaits::record(t0 + milliseconds(50), t0 + milliseconds(60));
  // ...the step's thread waited on the queue over [t0 + 20, t0 + 55]: 10 + 5 ms of it were the
  // peer's. The rest of its wait stays communication.
  REQUIRE(PeerWaits::overlap_ms(t0 + milliseconds(20), t0 + milliseconds(55)) ==
          Approx(15.0).epsilon(1e-9));
  // Waits that ended before then are forgotten; the one reaching past it is kept.
  REQUIRE(PeerWaits::overlap_ms(t0, t0 + milliseconds(100)) == Approx(10.0).epsilon(1e-9));
  REQUIRE(PeerWaits::overlap_ms(t0, t0 + milliseconds(100)) == 0);
  {
    PartScope comm(StepPart::communication);
    sleep_ms(20);
  }
  clock.reassign(StepPart::communication, StepPart::peer_wait, 15);
  clock.reassign(StepPart::forward, StepPart::peer_wait, 5);  // nothing there to move
  const StepParts parts = clock.stop();
  REQUIRE(parts[StepPart::peer_wait] == 15);
  REQUIRE(parts[StepPart::communication] >= 5);  // 20 ms slept, 15 moved
  REQUIRE(parts[StepPart::forward] == 0);
  StepClock::set_enabled(false);                 // --attribute off: the peer waits with the clocks
  PeerWaits::record(t0, t0 + milliseconds(30));  // off: not recorded
  REQUIRE(PeerWaits::overlap_ms(t0, t0 + milliseconds(30)) == 0);
}

TEST_CASE("--delay-rank takes R:MS and names what else it got", "[attribution]") {
  const RankDelay d = parse_rank_delay("2:12.5");
  REQUIRE(d.rank == 2);
  REQUIRE(d.ms == 12.5);
  REQUIRE(parse_rank_delay("0:60000").ms == 60000);
  for (const char* bad : {"1", "x:5", " 1:5", "+1:5", "-1:5", "0x1:5", "1:", "1:0", "1:-3", "1:nan",
                          "1:inf", "1:60001", "1:5ms", "1: 5", ""})
    REQUIRE_THROWS_WITH(parse_rank_delay(bad), Contains("--delay-rank") && Contains("R:MS"));
  REQUIRE_THROWS_WITH(parse_rank_delay("99999999999:5"), Contains("out of range"));
}

namespace {
RankAccount account(int rank, double compute, double comm) {
  RankAccount a{rank, 10, {}};
  a.mean[StepPart::backward] = compute;
  a.mean[StepPart::communication] = comm;
  return a;
}
}  // namespace

TEST_CASE("the late rank is the one the others wait for", "[attribution]") {
  // Rank 2 computes 50 ms longer: the others wait ~50 ms in their collectives, it waits ~0.
  const std::vector<RankAccount> late = {account(0, 10, 51), account(1, 10, 49), account(2, 60, 1),
                                         account(3, 10, 50)};
  const auto found = find_late_rank(late);
  REQUIRE(found);
  REQUIRE(found->rank == 2);
  REQUIRE(found->excess_ms == Approx(49.0).epsilon(1e-12));  // mean(51, 49, 50) - 1
  const std::string table = format_account(late, found);
  REQUIRE_THAT(table, Contains("late rank: 2") && Contains("49.000 ms per step"));
  const nlohmann::json j = account_json(late, found);
  REQUIRE(j["late_rank"] == 2);
  REQUIRE(j["ranks"][2]["step_ms"].get<double>() == Approx(61.0).epsilon(1e-12));
  REQUIRE(j["ranks"][0]["communication_ms"].get<double>() == 51.0);

  // Balanced ranks: differences under max(1 ms, 10 % of the step) name nobody.
  const std::vector<RankAccount> even = {account(0, 10, 5.0), account(1, 10, 5.9)};
  REQUIRE_FALSE(find_late_rank(even));
  REQUIRE(account_json(even, std::nullopt)["late_rank"].is_null());
  REQUIRE_FALSE(find_late_rank({account(0, 10, 0)}));  // one rank waits for nobody

  // Per step: a straggler waits least in every step; a rank descheduled once, which moves the
  // means just as much, waits least in 1 of 4 steps and is not named.
  std::vector<RankAccount> steady = {account(0, 10, 30), account(1, 10, 1), account(2, 10, 30)};
  steady[0].step_waits = {30, 30, 30, 30};
  steady[1].step_waits = {1, 1, 1, 1};
  steady[2].step_waits = {30, 30, 30, 30};
  REQUIRE(find_late_rank(steady));
  REQUIRE(find_late_rank(steady)->rank == 1);
  steady[1].step_waits = {1, 31, 31, 31};  // mean 23.5 < 30: the means alone would name it
  steady[1].mean[StepPart::communication] = 1;
  REQUIRE_FALSE(find_late_rank(steady));
  steady[1].step_waits = {1, 1, 1, 31};  // least in 3 of 4 steps: named
  REQUIRE(find_late_rank(steady)->rank == 1);
}
