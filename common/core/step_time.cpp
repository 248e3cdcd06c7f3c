#include "common/core/step_time.hpp"

#include "common/core/check.hpp"

namespace ringzero {

const char* step_part_name(StepPart part) {
  switch (part) {
    case StepPart::forward: return "forward";
    case StepPart::backward: return "backward";
    case StepPart::optimizer: return "optimizer";
    case StepPart::communication: return "communication";
    case StepPart::other: return "other";
  }
  return "?";
}

double StepParts::total_ms() const {
  double sum = 0;
  for (double m : ms) sum += m;
  return sum;
}

StepClock& StepClock::this_thread() {
  thread_local StepClock clock;
  return clock;
}

void StepClock::start() {
  parts_ = StepParts{};
  current_ = StepPart::other;
  last_ = Clock::now();
  armed_ = true;
}

StepParts StepClock::stop() {
  RZ_CHECK(armed_, "StepClock::stop without start");
  charge(Clock::now());
  armed_ = false;
  return parts_;
}

void StepClock::charge(Clock::time_point now) {
  parts_[current_] += std::chrono::duration<double, std::milli>(now - last_).count();
  last_ = now;
}

StepPart StepClock::enter(StepPart part) {
  charge(Clock::now());
  const StepPart previous = current_;
  current_ = part;
  return previous;
}

void StepClock::leave(StepPart previous) {
  charge(Clock::now());
  current_ = previous;
}

}  // namespace ringzero
