// trace: a timeline of what each rank did, in Chrome's trace event format.
//
// Provides: Tracer, a thread-safe recorder of spans ("complete" events: name, start, duration)
// and instants on numbered tracks (Chrome's tid: kMainTrack for the main thread, kCommTrack
// for the communication thread); span_if(), a span only while tracing; trace_layers(), which
// hooks every layer of a Model so that each layer's forward and backward become spans; and
// write_chrome_trace(), which gathers
// every rank's events on rank 0 into ONE file with one process per rank (pid = rank), for
// Perfetto (ui.perfetto.dev) or chrome://tracing. scripts/render_trace.py draws it as a PNG.
//
// The GPU's timeline (--device cuda): every span begun with open() and ended with close() (the
// Span, the layers' hooks, the communication queue's jobs and waits) is recorded twice, as the host
// ran it and as the GPU ran it, on the GPU track of its thread (main: "GPU compute stream"; comm:
// "GPU communication stream"): from when the GPU reached the work the thread had queued at
// open() to when it finished the work queued by close(), read from timed CUDA events on the
// thread's stream (common/core/device_backend.hpp's timed marks) once the trace is read. The
// GPU's clock is put on the host's by one event recorded while its stream was idle. A
// collective's NCCL kernels run on NCCL's stream, which the communication thread waits for by
// polling, so its GPU span ends when the thread has seen them finish (tens of µs late). On the
// host and the emulated device nothing more is recorded.
//
// Clocks: timestamps are microseconds since the tracer's epoch, read from the system clock,
// which every process of a node shares exactly (and nodes share to NTP's accuracy).
// sync_epoch() gives every rank rank 0's epoch, so the ranks' tracks line up: a barrier would
// not do, its exit skew is milliseconds on a busy machine.
// Format: https://docs.google.com/document/d/1CvAClvFfyA5R-PhYUmn5OOQtYMH4h6I0nSsKchNAySU
// ("ph":"X" complete events, "ph":"i" instants, "ph":"M" process/thread names).
// Leaves out: flow arrows, counters, async events, sampling.
#pragma once

#include <nlohmann/json.hpp>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace ringzero {

class Communicator;
class Model;

/// One recorded event. ts and dur in microseconds since the tracer's epoch; dur < 0 marks an
/// instant. seq is the recording order over all tracks of this process (0, 1, 2, ...).
struct TraceEvent {
  std::string name, cat;
  int track = 0;
  double ts = 0, dur = -1;
  int64_t seq = 0;
  nlohmann::json args;
};

class Tracer {
 public:
  static constexpr int kMainTrack = 0;  ///< forward, backward, optimizer step
  static constexpr int kCommTrack = 1;  ///< the communication thread's collectives
  static constexpr int kGpuComputeTrack = 2;  ///< --device cuda: the GPU's compute stream
  static constexpr int kGpuCommTrack = 3;     ///< --device cuda: the GPU's communication stream

  /// A disabled tracer records nothing (each call costs one atomic load).
  explicit Tracer(bool enabled = false);
  void set_enabled(bool on) { enabled_.store(on, std::memory_order_relaxed); }
  bool enabled() const { return enabled_.load(std::memory_order_relaxed); }

  /// Microseconds since the epoch.
  double now_us() const;
  /// Makes now the epoch.
  void reset_epoch();
  /// The epoch as microseconds of the system clock (what sync_epoch() sends), and its setter.
  double epoch_us() const;
  void set_epoch_us(double system_clock_us);

  /// A span [ts_us, ts_us + dur_us) on `track`. Thread-safe.
  void complete(std::string name, std::string cat, int track, double ts_us, double dur_us,
                nlohmann::json args = {});
  /// A point in time on `track`, now. Thread-safe.
  void instant(std::string name, std::string cat, int track, nlohmann::json args = {});

  /// A span begun: its start on the host clock and, on a GPU, a timed mark on the calling
  /// thread's stream (null elsewhere, and while not tracing).
  struct Opening {
    double start_us = 0;
    std::shared_ptr<void> device;
  };
  /// Begins a span now, on the calling thread.
  Opening open();
  /// Records the span from `opening` to now on `track`, and on a GPU its twin on the GPU's track
  /// for `track` (see the top of this file). Thread-safe.
  void close(const Opening& opening, std::string name, std::string cat, int track,
             nlohmann::json args = {});

  /// Records a span from construction to destruction (on the thread's own track).
  class Span {
   public:
    Span(Tracer& tracer, std::string name, std::string cat, int track = kMainTrack);
    ~Span();
    Span(const Span&) = delete;
    Span& operator=(const Span&) = delete;

   private:
    Tracer& tracer_;
    std::string name_, cat_;
    int track_;
    Opening opening_;
  };

  /// A copy of the events recorded so far, in recording order (the GPU's spans read first: waits
  /// until the GPU has run them).
  std::vector<TraceEvent> events() const;
  void clear();
  /// This process's events as Chrome trace events with pid = `pid`, plus the process and
  /// track names ("rank 0", "main thread", "comm thread"; the GPU streams' where they hold
  /// events).
  nlohmann::json chrome_events(int pid) const;

 private:
  // A GPU span whose events may not have run yet: read when the events are (events()).
  struct DeviceSpan {
    TraceEvent event;
    std::shared_ptr<void> start, end;
  };
  void read_device_spans_locked() const;
  // Appends `event` with the next seq (mutex_ held).
  void push_locked(TraceEvent event);

  std::atomic<bool> enabled_;
  std::chrono::system_clock::time_point epoch_;
  mutable std::mutex mutex_;
  mutable std::vector<TraceEvent> events_;  // + the GPU's spans once read (logically const)
  mutable std::vector<DeviceSpan> device_spans_;
  int64_t next_seq_ = 0;
  std::shared_ptr<void> device_reference_;  // a timed mark that ran at device_reference_us_
  double device_reference_us_ = 0;          // system-clock µs
};

/// A span on the main track while the result lives, when `tracer` is set and enabled; nothing
/// (and no string built) otherwise. E.g. the optimizer objects' "optimizer step" spans
/// (precision.hpp, shard_precision.hpp), set up by the driver (engine_lesson.hpp).
inline std::optional<Tracer::Span> span_if(Tracer* tracer, const char* name, const char* cat) {
  if (!tracer || !tracer->enabled()) return std::nullopt;
  return std::optional<Tracer::Span>(std::in_place, *tracer, name, cat);
}

/// Adds hooks to every layer of `model`: spans "forward <layer>" and "backward <layer>" (cat
/// "forward" / "backward") on the main track, e.g. "backward 2 (Linear)". They bracket the
/// layer's compute and what runs inside it: the pre hook runs after the hooks already added
/// (ZeRO-3's gather and wait), the post hook before them (its release and reduce-scatter), but
/// a parameter's gradient-ready hook runs inside the backward (chapters 05-07 launch a bucket
/// there), so a wait it makes (--no-overlap, ZeRO-2 freeing a bucket) is a "wait" span inside
/// the layer's (scripts/trace_overlap.py takes it out of the compute). The hooks stay for the
/// model's lifetime and record only while the tracer is enabled.
void trace_layers(Tracer& tracer, Model& model);

/// Collective: every rank takes rank 0's epoch (now, on rank 0), sent with all_reduce_metrics.
void sync_epoch(Communicator& comm, Tracer& tracer);

/// Collective: gathers every rank's events on rank 0 (Communicator::gather_strings, counted as
/// "metrics") and writes {"traceEvents": [...], "displayTimeUnit": "ms"} to `path` there.
/// Errors: the file cannot be written (names the path).
void write_chrome_trace(Communicator& comm, const Tracer& tracer, const std::string& path);

}  // namespace ringzero
