// step_time: where one optimizer step's wall-clock time went, on the thread that runs the step.
//
// Provides: StepPart (forward, backward, optimizer, communication, other), StepParts (a step's
// milliseconds per part), StepClock (one per thread, armed by the driver for the length of one
// step) and PartScope (charges the time until it ends to one part). Parts nest and are
// exclusive: a collective inside the optimizer's step (ZeRO's all-gather) is communication, not
// optimizer; "other" is what no scope claimed (batch copies, packing, the lesson's own loops).
// So the parts add up to the step's wall-clock time by construction.
// Communication is what the step's thread spent in the communicator or waiting on the
// communication queue: the time the backward did not hide. A collective run by the
// communication thread while the step's thread computes costs nothing here, because that
// thread's clock is never armed.
// Leaves out: the report (common/report/attribution.hpp), per-message waits for a late peer.
#pragma once

#include <array>
#include <chrono>

namespace ringzero {

/// What a step's time is charged to (--attribute's columns).
enum class StepPart : int { forward, backward, optimizer, communication, other };
inline constexpr int kStepParts = 5;

/// "forward", "backward", "optimizer", "communication", "other".
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
  /// Arms the clock at the start of a step: every part at 0, the time charged to `other`.
  void start();
  /// Disarms it; returns the step's parts (the time since start(), split).
  StepParts stop();
  bool armed() const { return armed_; }
  /// Charges the time since the last switch to the current part and makes `part` current;
  /// returns the part that was current (for leave). Call only while armed.
  StepPart enter(StepPart part);
  /// Charges the time since the last switch to the current part and makes `previous` current.
  void leave(StepPart previous);

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

}  // namespace ringzero
