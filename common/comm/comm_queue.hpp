// comm_queue: the communication thread (comm_thread.hpp) with what every engine does around a
// collective, written once: the collective check that runs before it (--check-collectives for
// chapters 05-07, collective_check.hpp; ZeRO-3's desync check, always) and its trace (--trace,
// trace.hpp): an instant on the main track when a checked one is queued, a span on the comm
// track when it runs, and a "wait" span on the main track while the main thread waits for it.
// An engine (chapters 05-08) says what a collective is (a Collective: kind, unit, length,
// bytes) and does (its job); no lesson line calls the tracer or the checker.
// Leaves out: the collectives themselves (the chapters'), the thread's error handling
// (comm_thread.hpp).
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <utility>

#include "common/checks/collective_check.hpp"
#include "common/comm/comm.hpp"
#include "common/comm/comm_thread.hpp"
#include "common/core/step_time.hpp"
#include "common/report/trace.hpp"

namespace ringzero {

/// A CommThread whose jobs are checked and traced. Main thread only, except the jobs.
class CommQueue {
 public:
  /// One collective of an engine, as the queue checks and traces it.
  struct Collective {
    uint32_t kind = 0;     ///< CollectiveSequence::Kind, or ZeRO-3's LayerCollective
    int unit = 0;          ///< the bucket or layer it works on
    int64_t elements = 0;  ///< its length, which the check compares across ranks
    int64_t bytes = 0;     ///< bytes of its buffer (the span's "bytes")
    int64_t params = -1;   ///< parameters in the unit (the span's "params"; -1: none)
    /// true: numbered and checked across ranks before it runs (when the sequence is enabled),
    /// traced with a posted instant and its time in the queue; false: posted in a fixed loop
    /// (the all-gathers of a ZeRO-1/2 step), neither.
    bool checked = true;
  };

  /// How the trace names a queue's collectives: `name(kind, unit)` for the span (e.g.
  /// "all_reduce bucket 3"), `posted` + " " + that name for the instant when it is queued,
  /// `category` for the instant ("ddp", "zero", "zero3").
  struct Naming {
    std::function<std::string(uint32_t kind, int unit)> name;
    std::string posted = "launch";
    std::string category;
  };

  /// comm (which must outlive it): where the checks run. tracer: null for no trace. sequence:
  /// the check (05-07's optional --check-collectives by default; ZeRO-3's desync check).
  CommQueue(Communicator& comm, Tracer* tracer, Naming naming,
            CollectiveSequence sequence = CollectiveSequence())
      : comm_(comm), tracer_(tracer), naming_(std::move(naming)), sequence_(std::move(sequence)) {
    ++created_;
  }

  /// Queues `job`, the collective `c`, on the communication thread; returns its ticket. A
  /// checked collective is numbered and, right before it runs, checked across ranks (every
  /// rank about to run the same one, or all stop naming both). Trace names are built only
  /// while tracing.
  uint64_t submit(const Collective& c, std::function<void()> job) {
    Traced t;
    std::optional<CollectiveHeader> header;
    if (c.checked) header = sequence_.next(c.kind, c.unit, c.elements);
    if (tracing()) {
      t.name = naming_.name(c.kind, c.unit);
      t.args = {{"bytes", c.bytes}};
      if (c.params >= 0) t.args["params"] = c.params;
      if (header) {
        t.args["seq"] = header->seq;
        tracer_->instant(naming_.posted + " " + t.name, naming_.category, Tracer::kMainTrack,
                         {{"seq", header->seq}});
      }
    }
    const double queued = now();
    const uint64_t ticket = thread_.submit(
        [this, t, header, job = std::move(job), queued]() mutable {
          if (header) sequence_.check(comm_, *header);
          const Tracer::Opening opening = t.name.empty() ? Tracer::Opening() : tracer_->open();
          job();
          if (t.name.empty()) return;  // not traced when queued
          if (header) t.args["queued_us"] = opening.start_us - queued;
          tracer_->close(opening, t.name, "comm", Tracer::kCommTrack, t.args);
        });
    if (!t.name.empty()) names_[ticket] = t.name;
    if (!overlap_) wait(ticket);  // --no-overlap
    return ticket;
  }

  /// Off (--no-overlap, a cause to plant for --attribute): submit() waits for each job where it
  /// is queued, so no collective overlaps the backward. The same collectives run in the same
  /// order on the same thread, so every number stays the same; only the wait moves. On by
  /// default; set before training, from the main thread.
  static void set_overlap(bool on) { overlap_ = on; }
  /// How many queues this process has made: 0 after set-up means the chapter runs its
  /// collectives on the step's thread (01-04), with nothing to overlap.
  static int created() { return created_; }

  /// Waits for job `ticket` and every one before it, traced as "wait <its name>" on the main
  /// track (the communication the compute did not hide). Rethrows a job's error.
  /// On a GPU each wait also has its twin on the compute stream: the stream's idle gap, which
  /// scripts/trace_overlap.py --gpu takes out of the compute around it.
  void wait(uint64_t ticket) {
    const ExposedWait exposed;  // --attribute
    const Tracer::Opening opening = tracing() ? tracer_->open() : Tracer::Opening();
    thread_.wait(ticket);
    const auto it = names_.find(ticket);
    if (it == names_.end()) return;
    if (tracing()) tracer_->close(opening, "wait " + it->second, "wait", Tracer::kMainTrack);
    names_.erase(names_.begin(), std::next(it));  // done: this one and every one before it
  }
  /// Waits for every queued job, traced as a "wait for collectives" span on the main track (and
  /// its GPU twin, as wait()'s); rethrows a job's error.
  void wait_all() {
    const ExposedWait exposed;  // --attribute
    const Tracer::Opening opening = tracing() ? tracer_->open() : Tracer::Opening();
    thread_.wait_all();
    names_.clear();
    if (tracing()) tracer_->close(opening, "wait for collectives", "wait", Tracer::kMainTrack);
  }
  /// Drains and stops the communication thread as its destructor would (CommThread::stop: when
  /// an exception is unwinding, queued collectives are dropped and a running one gives up), for
  /// an owner whose buffers die before the queue (chapter 07's Zero2). Nothing may follow.
  void stop() { thread_.stop(); }

 private:
  struct Traced {
    std::string name;     // its span on the comm track ("" while not tracing)
    nlohmann::json args;  // the span's args
  };
  // --attribute: the step's thread waiting for the queue is exposed communication, less the
  // stretch of it the communication thread spent waiting for a peer (step_time.hpp).
  class ExposedWait {
   public:
    ExposedWait() : start_(StepClock::Clock::now()) {}
    ~ExposedWait() {
      part_.reset();  // charged to communication up to here
      if (PeerWaits::enabled())
        StepClock::this_thread().reassign(StepPart::communication, StepPart::peer_wait,
                                          PeerWaits::overlap_ms(start_, StepClock::Clock::now()));
    }

   private:
    StepClock::Clock::time_point start_;
    std::optional<PartScope> part_{std::in_place, StepPart::communication};
  };
  bool tracing() const { return tracer_ && tracer_->enabled(); }
  // Microseconds on the tracer's clock; 0 (no clock read) while not tracing.
  double now() const { return tracing() ? tracer_->now_us() : 0; }

  static inline bool overlap_ = true;
  static inline int created_ = 0;
  Communicator& comm_;
  Tracer* tracer_;
  Naming naming_;
  CollectiveSequence sequence_;             // numbers and checks the checked collectives
  std::map<uint64_t, std::string> names_;   // tickets not yet waited for, while tracing
  CommThread thread_;  // last: destroyed (drained) first
};

/// How chapters 05-07 name their bucket collectives: "all_reduce bucket 3", "reduce_scatter
/// bucket 0", "all_gather bucket 1", posted as "launch all_reduce bucket 3"; category "ddp" or
/// "zero".
inline CommQueue::Naming bucket_naming(std::string category) {
  return {[](uint32_t kind, int b) {
            static const char* kinds[] = {"all_reduce", "reduce_scatter", "all_gather"};
            return std::string(kinds[kind % 3]) + " bucket " + std::to_string(b);
          },
          "launch", std::move(category)};
}

}  // namespace ringzero
