#include "common/core/step_time.hpp"

#include <algorithm>
#include <atomic>
#include <mutex>
#include <utility>
#include <vector>

namespace ringzero {

const char* step_part_name(StepPart part) {
  switch (part) {
    case StepPart::forward: return "forward";
    case StepPart::backward: return "backward";
    case StepPart::optimizer: return "optimizer";
    case StepPart::communication: return "communication";
    case StepPart::peer_wait: return "peer_wait";
    case StepPart::copies: return "copies";
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

namespace {
std::atomic<bool> clocks_on{false};
std::mutex peer_waits_mutex;
std::vector<std::pair<StepClock::Clock::time_point, StepClock::Clock::time_point>> peer_waits;
}  // namespace

void StepClock::set_enabled(bool on) { clocks_on = on; }

bool StepClock::enabled() { return clocks_on; }

void StepClock::start() {
  if (!clocks_on) return;
  parts_ = StepParts{};
  current_ = StepPart::other;
  last_ = Clock::now();
  armed_ = true;
  {  // a peer wait that ended before this step can overlap none of its waits
    std::lock_guard<std::mutex> lock(peer_waits_mutex);
    std::erase_if(peer_waits, [&](const auto& w) { return w.second < last_; });
  }
}

StepParts StepClock::stop() {
  if (!armed_) return StepParts{};
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

void StepClock::reassign(StepPart from, StepPart to, double ms) {
  if (!armed_) return;
  const double moved = std::clamp(ms, 0.0, parts_[from]);
  parts_[from] -= moved;
  parts_[to] += moved;
}

void PeerWaits::record(Clock::time_point t0, Clock::time_point t1) {
  if (!PeerWaits::enabled()) return;
  std::lock_guard<std::mutex> lock(peer_waits_mutex);
  peer_waits.emplace_back(t0, t1);
}

double PeerWaits::overlap_ms(Clock::time_point t0, Clock::time_point t1) {
  std::lock_guard<std::mutex> lock(peer_waits_mutex);
  double ms = 0;
  for (const auto& [a, b] : peer_waits)
    if (std::max(a, t0) < std::min(b, t1))
      ms += std::chrono::duration<double, std::milli>(std::min(b, t1) - std::max(a, t0)).count();
  std::erase_if(peer_waits, [&](const auto& w) { return w.second <= t1; });
  return ms;
}

}  // namespace ringzero
