#include "common/report/cost_model.hpp"

#include <algorithm>
#include <cmath>
#include <cstdlib>

#include "common/core/check.hpp"

namespace ringzero {

namespace {
void check_network(const Network& net) {
  RZ_CHECK(net.bandwidth_gbps > 0 && std::isfinite(net.bandwidth_gbps),
           "network bandwidth " << net.bandwidth_gbps
                                << " Gbit/s: give --net-bandwidth > 0 (Gbit/s per link), or "
                                   "--net-selftest with scripts/cluster selftest's JSON");
  RZ_CHECK(net.alpha_us >= 0 && std::isfinite(net.alpha_us),
           "network latency " << net.alpha_us << " us: give --net-alpha-us >= 0");
  RZ_CHECK(net.fabric_gbps >= 0 && std::isfinite(net.fabric_gbps),
           "network fabric " << net.fabric_gbps << " Gbit/s: must be >= 0 (0: unlimited)");
}
}  // namespace

double Network::message_ms(double bytes) const {
  check_network(*this);
  return alpha_us * 1e-3 + bytes * 8.0 / (bandwidth_gbps * 1e9) * 1e3;
}

const char* overlap_name(Overlap overlap) {
  switch (overlap) {
    case Overlap::none:
      return "none";
    case Overlap::backward:
      return "backward";
    case Overlap::forward_and_backward:
      return "forward_and_backward";
  }
  return "?";
}

double overlappable_fraction(Overlap overlap) {
  switch (overlap) {
    case Overlap::none:
      return 0;
    case Overlap::backward:
      return 2.0 / 3.0;  // a linear layer's backward: two matrix products of its forward's size
    case Overlap::forward_and_backward:
      return 1;
  }
  return 0;
}

namespace {
// The busiest rank's α part (messages · α) and β part (bytes / β) of one operation, in ms, and
// the most calls per step of any rank.
struct OpParts {
  double alpha_ms = 0, beta_ms = 0, calls = 0;
};
OpParts op_parts(const Network& net, const std::vector<OpTraffic>& per_rank) {
  check_network(net);
  OpParts worst;
  double calls = 0;  // the most calls of any rank
  for (const OpTraffic& t : per_rank) {
    const double messages = std::max(t.messages_sent, t.messages_received);
    const double bytes = std::max(t.bytes_sent, t.bytes_received);
    const OpParts p{messages * net.alpha_us * 1e-3, bytes * 8.0 / (net.bandwidth_gbps * 1e6)};
    if (p.alpha_ms + p.beta_ms > worst.alpha_ms + worst.beta_ms) worst = p;
    calls = std::max(calls, t.calls);
  }
  worst.calls = calls;
  if (net.fabric_gbps > 0) {  // every rank's bytes through the one fabric
    double sent = 0, received = 0;
    for (const OpTraffic& t : per_rank) sent += t.bytes_sent, received += t.bytes_received;
    worst.beta_ms =
        std::max(worst.beta_ms, std::max(sent, received) * 8.0 / (net.fabric_gbps * 1e6));
  }
  return worst;
}

// One collective's time in the operations `parts`, each of which runs `copies` collectives of
// every size per step (ZeRO-3 gathers each layer twice): the α part shared equally among the
// calls, the β part in proportion to the size.
std::vector<double> per_collective_ms(const std::vector<OpParts>& parts,
                                      const std::vector<double>& sizes, double copies) {
  double total = 0;
  for (double n : sizes) total += n;
  std::vector<double> ms(sizes.size(), 0.0);
  for (const OpParts& p : parts)
    for (size_t c = 0; c < sizes.size(); ++c)
      ms[c] += p.alpha_ms / p.calls + p.beta_ms * sizes[c] / (total * copies);
  return ms;
}

/// f, the share of compute that communication can hide: overlappable_fraction(), or, where
/// forward and backward were measured, backward's share (ZeRO-3's prefetch: both's).
double overlappable_share(const StepSchedule& schedule) {
  if (schedule.backward_ms <= 0 || schedule.compute_ms <= 0 || schedule.overlap == Overlap::none)
    return overlappable_fraction(schedule.overlap);
  const double hidden = schedule.backward_ms + (schedule.overlap == Overlap::forward_and_backward
                                                    ? schedule.forward_ms
                                                    : 0.0);
  return std::min(1.0, hidden / schedule.compute_ms);
}

/// predict_step's checks of its arguments, in the order it reports them.
void check_step_inputs(const Network& net, int world_size, const StepSchedule& schedule) {
  const double compute_ms = schedule.compute_ms;
  const int cores = schedule.cores;
  const int64_t micro_batches = schedule.micro_batches;
  check_network(net);
  RZ_CHECK(micro_batches >= 1, "predict_step: " << micro_batches << " micro-batches per step");
  RZ_CHECK(world_size >= 1, "predict_step: world_size " << world_size << " < 1");
  RZ_CHECK(cores >= 0, "--net-cores " << cores << " must be >= 0 (0: not given)");
  RZ_CHECK(compute_ms >= 0 && std::isfinite(compute_ms),
           "compute time " << compute_ms
                           << " ms: give --net-compute-ms >= 0, the step time of this chapter "
                              "at N = 1 on one rank's share of the batch");
  RZ_CHECK(schedule.forward_ms >= 0 && schedule.backward_ms >= 0 &&
               schedule.forward_ms + schedule.backward_ms <= compute_ms * (1 + 1e-9),
           "predict_step: forward " << schedule.forward_ms << " ms and backward "
                                    << schedule.backward_ms << " ms must be >= 0 and within "
                                    << "compute " << compute_ms << " ms");
}

/// The overlapped operations' parts, by the engine of the replay that schedules them, and
/// their time in all (ms).
struct ReplayParts {
  std::vector<OpParts> overlapped_parts;      ///< Overlap::backward: every overlapped operation
  std::vector<OpParts> gather_parts;          ///< ZeRO-3's prefetch: the all-gathers
  std::vector<OpParts> reduce_scatter_parts;  ///< ZeRO-3's prefetch: the reduce-scatters
  double replayed_comm_ms = 0;                ///< the operations the replay schedules
};

/// One pass over the operations (but "metrics"): each one's time into p.ops_ms and p.comm_ms;
/// those that overlap compute (`f` > 0: its overlappable share) into p.overlapped_comm_ms and
/// p.collectives, and their parts, which the replay schedules, returned.
ReplayParts sum_operations(const Network& net, const TrafficPerStep& traffic,
                           const StepSchedule& schedule, double f, StepPrediction& p) {
  const std::vector<std::string>& overlapped_ops = schedule.overlapped_ops;
  ReplayParts replay;
  for (const auto& [op, per_rank] : traffic) {
    if (op == "metrics") continue;  // the loss all-reduce is modelled apart; reports are not steps
    const OpParts parts = op_parts(net, per_rank);
    const double ms = parts.alpha_ms + parts.beta_ms;
    p.ops_ms.emplace_back(op, ms);
    p.comm_ms += ms;
    const bool overlapped =
        f > 0 && (overlapped_ops.empty() || std::find(overlapped_ops.begin(), overlapped_ops.end(),
                                                      op) != overlapped_ops.end());
    if (!overlapped) continue;
    p.overlapped_comm_ms += ms;
    p.collectives = std::max(p.collectives, static_cast<int64_t>(std::llround(parts.calls)));
    if (schedule.overlap == Overlap::backward) {
      replay.overlapped_parts.push_back(parts);
      replay.replayed_comm_ms += ms;
    } else {  // ZeRO-3's prefetch: the gathers and the reduce-scatters, layer by layer
      const bool gather = op.find("all_gather") != std::string::npos;
      const bool scatter = op.find("reduce_scatter") != std::string::npos;
      if (gather) replay.gather_parts.push_back(parts);
      if (scatter) replay.reduce_scatter_parts.push_back(parts);
      if (gather || scatter) replay.replayed_comm_ms += ms;
    }
  }
  return replay;
}

/// Whether `parts` is not empty and each of its operations makes `calls` calls per step.
bool calls_are(const std::vector<OpParts>& parts, double calls) {
  if (parts.empty()) return false;
  for (const OpParts& q : parts)
    if (std::llround(q.calls) != std::llround(calls)) return false;
  return true;
}

/// p.overlapped_ms and p.replayed, from p's comm_ms, serial_ms, overlapped_comm_ms and
/// collectives: the replay where the chapter named its collectives' sizes and the counters
/// agree with them, else the closed form (see the header). `f`: the overlappable share.
void overlap_step(const StepSchedule& schedule, double f, const ReplayParts& replay,
                  StepPrediction& p) {
  const double compute_ms = schedule.compute_ms;
  const std::vector<double>& sizes = schedule.sizes;
  const Overlap overlap = schedule.overlap;
  const double replayed_comm_ms = replay.replayed_comm_ms;
  // The replay, where the chapter named its collectives and the counters agree with them.
  const double n = static_cast<double>(sizes.size());
  if (!sizes.empty() && overlap == Overlap::backward && calls_are(replay.overlapped_parts, n)) {
    p.replayed = true;
    p.overlapped_ms = (1 - f) * compute_ms +
                      replay_backward_buckets(f * compute_ms, sizes,
                                              per_collective_ms(replay.overlapped_parts, sizes, 1),
                                              schedule.max_in_flight) +
                      (p.comm_ms - replayed_comm_ms);
  } else if (!sizes.empty() && overlap == Overlap::forward_and_backward &&
             calls_are(replay.gather_parts, 2 * n) && calls_are(replay.reduce_scatter_parts, n)) {
    p.replayed = true;
    // Forward one third of the compute, backward two thirds (see overlappable_fraction), or
    // as measured, the rest after them.
    const bool measured = schedule.backward_ms > 0;
    const double forward_ms = measured ? schedule.forward_ms : compute_ms / 3;
    const double backward_ms = measured ? schedule.backward_ms : 2 * compute_ms / 3;
    p.overlapped_ms =
        replay_zero3_prefetch(forward_ms, backward_ms, sizes,
                              per_collective_ms(replay.gather_parts, sizes, 2),
                              per_collective_ms(replay.reduce_scatter_parts, sizes, 1)) +
        (compute_ms - forward_ms - backward_ms) + (p.comm_ms - replayed_comm_ms);
  } else if (p.overlapped_comm_ms == 0) {
    p.overlapped_ms = p.serial_ms;
  } else {
    const double ov = p.overlapped_comm_ms, after = p.comm_ms - ov;
    const double last = ov / static_cast<double>(std::max<int64_t>(1, p.collectives));
    p.overlapped_ms = (1 - f) * compute_ms + std::max(f * compute_ms, ov - last) + last + after;
  }
}

}  // namespace

bool overlap_possible(int cores, int world_size) { return cores == 0 || cores > world_size; }

double op_time_ms(const Network& net, const std::vector<OpTraffic>& per_rank) {
  const OpParts p = op_parts(net, per_rank);
  return p.alpha_ms + p.beta_ms;
}

StepPrediction predict_step(const Network& net, const TrafficPerStep& traffic, int world_size,
                            const StepSchedule& schedule) {
  check_step_inputs(net, world_size, schedule);
  const double compute_ms = schedule.compute_ms;
  const Overlap overlap = schedule.overlap;
  StepPrediction p;
  p.compute_ms = compute_ms;
  p.overlap = overlap;
  // With K micro-batches, DDP/ZeRO-1/2 communicate during the last one's backward only.
  const double f = overlappable_share(schedule) /
                   (overlap == Overlap::backward ? static_cast<double>(schedule.micro_batches) : 1.0);
  // One pass over the operations: each one's time, and the parts the replay schedules.
  const ReplayParts replay = sum_operations(net, traffic, schedule, f, p);
  if (world_size > 1) {
    const double loss_ms = std::ceil(std::log2(world_size)) * net.alpha_us * 1e-3;
    p.ops_ms.emplace_back("loss all-reduce", loss_ms);
    p.comm_ms += loss_ms;
  }
  p.serial_ms = compute_ms + p.comm_ms;
  overlap_step(schedule, f, replay, p);
  p.cores = schedule.cores;
  p.ranks = world_size;
  p.overlap_possible = overlap_possible(schedule.cores, world_size);
  p.predicted_ms = p.overlap_possible ? p.overlapped_ms : p.serial_ms;
  return p;
}

double central_reducer_ms(const Network& net, int world_size, double bytes) {
  return 2.0 * (world_size - 1) * net.message_ms(bytes);
}

double ring_phase_ms(const Network& net, int world_size, double bytes) {
  return (world_size - 1) * net.message_ms(bytes / world_size);
}

double ring_all_reduce_ms(const Network& net, int world_size, double bytes) {
  return 2 * ring_phase_ms(net, world_size, bytes);
}

}  // namespace ringzero
