// step_time: where one optimizer step's wall-clock time went, on the thread that runs the step.
//
// Provides: StepPart (forward, backward, optimizer, communication, peer_wait, copies, other),
// StepParts (a step's milliseconds per part), StepClock (one per thread, armed by the driver for
// the length of one step, only with --attribute), PartScope (charges the time until it ends to
// one part) and PeerWaits (when on, the communicator tells waiting for a peer from transfer). Parts nest and are
// exclusive: a collective inside the optimizer's step (ZeRO's all-gather) is communication, not
// optimizer; "copies" is moving or converting elements between buffers (copy_memory: ZeRO's
// shard copies, host staging, device transfers; convert_to_half/convert_to_float: the 16-bit
// working copies and their gradients), wherever on the step's thread it happens (a copy in a
// communication-thread job is part of that job); "other" is what no scope claimed
// (building the batch, the lesson's own loops).
// So the parts add up to the step's wall-clock time by construction.
// Communication is what the step's thread spent in the communicator or waiting on the
// communication queue: the time the backward did not hide. A collective run by the
// communication thread while the step's thread computes costs nothing here, because that
// thread's clock is never armed.
// Waiting for a peer (peer_wait) is the part of communication spent before a message's sender
// had sent it: with PeerWaits on, a receive first waits for the message to be there (MPI_Probe),
// then transfers it. On the step's thread that wait is its own part; on the communication thread
// it is recorded (PeerWaits::record), and the step's thread claims the stretch of its own wait
// on the queue that it overlapped (PeerWaits::overlap_ms). Before a collective, a barrier waits
// for every rank to arrive (comm_detail::wait_for_peers): that wait is peer_wait too.
// Leaves out: the report (common/report/attribution.hpp).
#pragma once

#include <array>
#include <chrono>

namespace ringzero {

/// What a step's time is charged to (--attribute's columns).
enum class StepPart : int { forward, backward, optimizer, communication, peer_wait, copies, other };
inline constexpr int kStepParts = 7;

/// "forward", "backward", "optimizer", "communication", "peer_wait", "copies", "other".
const char* step_part_name(StepPart part);

/// One step's milliseconds per part.
struct StepParts {
  std::array<double, kStepParts> ms{};
  double& operator[](StepPart p) { return ms[static_cast<int>(p)]; }
  double operator[](StepPart p) const { return ms[static_cast<int>(p)]; }
  /// The sum of the parts: the step's wall-clock time, in ms.
  double total_ms() const;
};

/// The clock of the calling thread. Disarmed (the default) every PartScope is a no-op: one
/// thread-local read, no clock read, so the numbers of a run are the same with or without it.
class StepClock {
 public:
  using Clock = std::chrono::steady_clock;
  /// This thread's clock.
  static StepClock& this_thread();
  /// Whether start() arms clocks at all (--attribute turns it on; off by default, so a run
  /// without it reads no clock in any scope).
  static void set_enabled(bool on);
  static bool enabled();
  /// Arms the clock at the start of a step, if clocks are enabled: every part at 0, the time
  /// charged to `other`.
  void start();
  /// Disarms it; returns the step's parts (the time since start(), split; all 0 if start() did
  /// not arm it).
  StepParts stop();
  bool armed() const { return armed_; }
  /// Charges the time since the last switch to the current part and makes `part` current;
  /// returns the part that was current (for leave). Call only while armed.
  StepPart enter(StepPart part);
  /// Charges the time since the last switch to the current part and makes `previous` current.
  void leave(StepPart previous);
  /// Moves up to `ms` already charged to `from` over to `to` (a wait found, afterwards, to have
  /// been a wait for a peer). Does nothing while disarmed.
  void reassign(StepPart from, StepPart to, double ms);

 private:
  void charge(Clock::time_point now);
  bool armed_ = false;
  StepPart current_ = StepPart::other;
  Clock::time_point last_{};
  StepParts parts_{};
};

/// Charges the time from its construction to its end to `part` on this thread's clock (the
/// outer part resumes after it); does nothing while the clock is disarmed.
class PartScope {
 public:
  explicit PartScope(StepPart part) : clock_(StepClock::this_thread()) {
    if (clock_.armed()) {
      active_ = true;
      previous_ = clock_.enter(part);
    }
  }
  ~PartScope() {
    if (active_ && clock_.armed()) clock_.leave(previous_);
  }
  PartScope(const PartScope&) = delete;
  PartScope& operator=(const PartScope&) = delete;

 private:
  StepClock& clock_;
  bool active_ = false;
  StepPart previous_ = StepPart::other;
};

/// Waiting for a peer, told apart from transfer: on while the clocks are (StepClock::enabled(),
/// --attribute). Off, the communicator makes exactly the MPI calls it makes without attribution.
class PeerWaits {
 public:
  using Clock = StepClock::Clock;
  static bool enabled() { return StepClock::enabled(); }
  /// A wait for a peer from t0 to t1 on a thread whose clock is not armed (the communication
  /// thread), for the step's thread to claim.
  static void record(Clock::time_point t0, Clock::time_point t1);
  /// Milliseconds of the recorded waits that fall inside [t0, t1]; forgets every wait that ended
  /// before t1 (the step's thread waits in order: no later wait reaches back before t1).
  static double overlap_ms(Clock::time_point t0, Clock::time_point t1);
};

/// A wait for a peer's message, from construction to end: on an armed clock the peer_wait part,
/// else (the communication thread) recorded in PeerWaits.
class PeerWaitScope {
 public:
  PeerWaitScope() : part_(StepPart::peer_wait), start_(StepClock::Clock::now()) {}
  ~PeerWaitScope() {
    if (!StepClock::this_thread().armed()) PeerWaits::record(start_, StepClock::Clock::now());
  }
  PeerWaitScope(const PeerWaitScope&) = delete;
  PeerWaitScope& operator=(const PeerWaitScope&) = delete;

 private:
  PartScope part_;
  StepClock::Clock::time_point start_;
};

}  // namespace ringzero
