// comm_queue: the communication thread (comm_thread.hpp) with what every engine does around a
// collective, written once: the collective check that runs before it (--check-collectives,
// collective_check.hpp; ZeRO-3's desync header) and its trace (--trace, trace.hpp): an instant
// on the main track when it is queued, a span on the comm track when it runs, and a "wait"
// span on the main track while the main thread waits for it. The engines (chapters 05-08) say
// what a collective is and does; no lesson line calls the tracer or the checker.
// Leaves out: the collectives themselves (the chapters'), the thread's error handling
// (comm_thread.hpp).
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <functional>
#include <string>
#include <utility>

#include "comm_thread.hpp"
#include "trace.hpp"

namespace ringzero {

/// A CommThread whose jobs are checked and traced. Main thread only, except the jobs.
class CommQueue {
 public:
  /// What the trace shows of one collective.
  struct Traced {
    std::string name;            ///< its span on the comm track, e.g. "all_reduce bucket 3"
    nlohmann::json args;         ///< the span's args (e.g. "bytes")
    std::string posted;          ///< the instant on the main track when queued ("" for none)
    std::string category;        ///< that instant's category ("ddp", "zero", "zero3")
    nlohmann::json posted_args;  ///< the instant's args
    bool queued_us = false;      ///< the span also records "queued_us": queued to started, µs
  };

  /// tracer: null for no trace (then this is a plain CommThread).
  explicit CommQueue(Tracer* tracer) : tracer_(tracer) {}

  /// Queues check() then job() on the communication thread, traced as `t`; returns its ticket.
  /// check: the collective check every rank runs before the collective (empty: none).
  uint64_t submit(Traced t, std::function<void()> check, std::function<void()> job) {
    const double queued = now();
    if (tracer_ && !t.posted.empty())
      tracer_->instant(t.posted, t.category, Tracer::kMainTrack, t.posted_args);
    return thread_.submit(
        [this, t = std::move(t), check = std::move(check), job = std::move(job), queued]() mutable {
          if (check) check();
          const double start = now();
          job();
          if (!tracer_) return;
          if (t.queued_us) t.args["queued_us"] = start - queued;
          tracer_->complete(t.name, "comm", Tracer::kCommTrack, start, now() - start, t.args);
        });
  }
  /// Waits for job `ticket` and every one before it; a non-empty `label` is traced as a "wait"
  /// span on the main track. Rethrows a job's error.
  void wait(uint64_t ticket, const std::string& label = "") {
    const double start = now();
    thread_.wait(ticket);
    if (tracer_ && !label.empty())
      tracer_->complete(label, "wait", Tracer::kMainTrack, start, now() - start);
  }
  /// Waits for every queued job; rethrows a job's error.
  void wait_all() { thread_.wait_all(); }
  /// Microseconds on the tracer's clock, 0 without a tracer.
  double now() const { return tracer_ ? tracer_->now_us() : 0; }
  Tracer* tracer() const { return tracer_; }

 private:
  Tracer* tracer_;
  CommThread thread_;  // last: destroyed (drained) first
};

}  // namespace ringzero
