#include "common/report/trace.hpp"

#include <algorithm>
#include <fstream>
#include <memory>
#include <utility>

#include "common/comm/comm.hpp"
#include "common/core/check.hpp"
#include "common/core/device_backend.hpp"
#include "common/core/nn.hpp"
#include "common/io/atomic_file.hpp"

namespace ringzero {

using SystemUs = std::chrono::duration<double, std::micro>;

Tracer::Tracer(bool enabled) : enabled_(enabled), epoch_(std::chrono::system_clock::now()) {}

double Tracer::now_us() const {
  return SystemUs(std::chrono::system_clock::now() - epoch_).count();
}

void Tracer::reset_epoch() {
  epoch_ = std::chrono::system_clock::now();
}

double Tracer::epoch_us() const {
  return SystemUs(epoch_.time_since_epoch()).count();
}

void Tracer::set_epoch_us(double system_clock_us) {
  epoch_ = std::chrono::system_clock::time_point(
      std::chrono::duration_cast<std::chrono::system_clock::duration>(SystemUs(system_clock_us)));
}

void Tracer::complete(std::string name, std::string cat, int track, double ts_us, double dur_us,
                      nlohmann::json args) {
  if (!enabled()) return;
  std::lock_guard<std::mutex> lock(mutex_);
  push_locked(
      {std::move(name), std::move(cat), track, ts_us, std::max(dur_us, 0.0), 0, std::move(args)});
}

void Tracer::push_locked(TraceEvent event) {
  event.seq = next_seq_++;
  events_.push_back(std::move(event));
}

void Tracer::instant(std::string name, std::string cat, int track, nlohmann::json args) {
  if (!enabled()) return;
  const double ts = now_us();
  std::lock_guard<std::mutex> lock(mutex_);
  push_locked({std::move(name), std::move(cat), track, ts, -1, 0, std::move(args)});
}

Tracer::Opening Tracer::open() {
  if (!enabled()) return {};
  std::shared_ptr<void> mark = mark_device_work(/*timed=*/true);  // null off a GPU
  if (mark) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!device_reference_) {  // the GPU's clock on the host's, once: a mark on an idle stream
      finish_device_work();    // so the mark runs as it is recorded
      device_reference_ = mark_device_work(true);
      device_reference_us_ = epoch_us() + now_us();
    }
  }
  return {now_us(), std::move(mark)};
}

void Tracer::close(const Opening& opening, std::string name, std::string cat, int track,
                   nlohmann::json args) {
  if (!enabled()) return;
  std::shared_ptr<void> end = opening.device ? mark_device_work(true) : nullptr;
  const double dur = now_us() - opening.start_us;
  std::lock_guard<std::mutex> lock(mutex_);  // both, or neither
  if (end) {
    const int gpu_track = track == kCommTrack ? kGpuCommTrack : kGpuComputeTrack;
    device_spans_.push_back({{name, cat, gpu_track, 0, 0, next_seq_++, args}, opening.device, end});
  }
  push_locked({std::move(name), std::move(cat), track, opening.start_us, std::max(dur, 0.0), 0,
               std::move(args)});
}

void Tracer::read_device_spans_locked() const {
  if (device_spans_.empty()) return;
  const double reference_us = device_reference_us_ - epoch_us();  // on this epoch
  for (DeviceSpan& s : device_spans_) {
    s.event.ts = reference_us + 1e3 * device_elapsed_ms(device_reference_, s.start);
    s.event.dur = std::max(0.0, 1e3 * device_elapsed_ms(s.start, s.end));
    events_.push_back(std::move(s.event));
  }
  device_spans_.clear();
  std::sort(events_.begin(), events_.end(),
            [](const TraceEvent& a, const TraceEvent& b) { return a.seq < b.seq; });
}

Tracer::Span::Span(Tracer& tracer, std::string name, std::string cat, int track)
    : tracer_(tracer),
      name_(std::move(name)),
      cat_(std::move(cat)),
      track_(track),
      opening_(tracer.open()) {}

Tracer::Span::~Span() {
  tracer_.close(opening_, std::move(name_), std::move(cat_), track_);
}

std::vector<TraceEvent> Tracer::events() const {
  std::lock_guard<std::mutex> lock(mutex_);
  read_device_spans_locked();
  return events_;
}

void Tracer::clear() {
  std::lock_guard<std::mutex> lock(mutex_);
  events_.clear();
  device_spans_.clear();
}

nlohmann::json Tracer::chrome_events(int pid) const {
  nlohmann::json out = nlohmann::json::array();
  out.push_back({{"name", "process_name"},
                 {"ph", "M"},
                 {"pid", pid},
                 {"args", {{"name", "rank " + std::to_string(pid)}}}});
  out.push_back(
      {{"name", "process_sort_index"}, {"ph", "M"}, {"pid", pid}, {"args", {{"sort_index", pid}}}});
  out.push_back({{"name", "thread_name"},
                 {"ph", "M"},
                 {"pid", pid},
                 {"tid", kMainTrack},
                 {"args", {{"name", "main thread (compute)"}}}});
  out.push_back({{"name", "thread_name"},
                 {"ph", "M"},
                 {"pid", pid},
                 {"tid", kCommTrack},
                 {"args", {{"name", "comm thread"}}}});
  const std::vector<TraceEvent> recorded = events();
  for (const auto& [track, name] : {std::pair{kGpuComputeTrack, "GPU compute stream"},
                                    std::pair{kGpuCommTrack, "GPU communication stream"}})
    if (std::any_of(recorded.begin(), recorded.end(),
                    [track](const TraceEvent& e) { return e.track == track; }))
      out.push_back({{"name", "thread_name"},
                     {"ph", "M"},
                     {"pid", pid},
                     {"tid", track},
                     {"args", {{"name", name}}}});
  for (const TraceEvent& e : recorded) {
    nlohmann::json j = {
        {"name", e.name}, {"cat", e.cat}, {"pid", pid}, {"tid", e.track}, {"ts", e.ts}};
    if (e.dur < 0) {
      j["ph"] = "i";
      j["s"] = "t";  // an instant scoped to its track
    } else {
      j["ph"] = "X";
      j["dur"] = e.dur;
    }
    if (!e.args.is_null()) j["args"] = e.args;
    out.push_back(std::move(j));
  }
  return out;
}

void trace_layers(Tracer& tracer, Model& model) {
  for (auto& layer : model.net.layers) {
    Module& m = *layer;
    const std::string kind = dynamic_cast<Linear*>(&m) ? "Linear"
                             : dynamic_cast<ReLU*>(&m) ? "ReLU"
                                                       : "Module";
    const std::string label = m.name() + " (" + kind + ")";
    // A layer's forward (or backward) never nests inside itself, so one start time per
    // direction is enough; shared by the pre and post hooks of that direction.
    auto fwd = std::make_shared<Tracer::Opening>(), bwd = std::make_shared<Tracer::Opening>();
    m.add_pre_forward_hook([&tracer, fwd](Module&) { *fwd = tracer.open(); });
    m.add_post_forward_hook(
        [&tracer, fwd, label](Module&) {
          tracer.close(*fwd, "forward " + label, "forward", Tracer::kMainTrack);
        },
        /*first=*/true);
    m.add_pre_backward_hook([&tracer, bwd](Module&) { *bwd = tracer.open(); });
    m.add_post_backward_hook(
        [&tracer, bwd, label](Module&) {
          tracer.close(*bwd, "backward " + label, "backward", Tracer::kMainTrack);
        },
        /*first=*/true);
  }
}

void sync_epoch(Communicator& comm, Tracer& tracer) {
  tracer.reset_epoch();
  std::vector<double> epoch = {comm.rank() == 0 ? tracer.epoch_us()
                                                : 0.0};  // µs since 1970: exact in a double
  comm.all_reduce_metrics(epoch);
  tracer.set_epoch_us(epoch[0]);
}

void write_chrome_trace(Communicator& comm, const Tracer& tracer, const std::string& path) {
  const std::vector<std::string> all =
      comm.gather_strings(tracer.chrome_events(comm.rank()).dump(), /*root=*/0);
  if (comm.rank() != 0) return;
  nlohmann::json events = nlohmann::json::array();
  for (const std::string& s : all)
    for (auto& e : nlohmann::json::parse(s)) events.push_back(std::move(e));
  // Atomically (temporary file, fsync, rename): a crash mid-write keeps the previous trace.
  write_file_atomically(
      path,
      nlohmann::json{{"traceEvents", std::move(events)}, {"displayTimeUnit", "ms"}}.dump() + "\n");
}

}  // namespace ringzero
