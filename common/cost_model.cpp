#include "common/cost_model.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "common/check.hpp"
#include "common/safetensors.hpp"

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

std::string fmt(const char* format, double a, double b = 0, double c = 0, double d = 0) {
  char buf[256];
  std::snprintf(buf, sizeof buf, format, a, b, c, d);
  return buf;
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

}  // namespace

double op_time_ms(const Network& net, const std::vector<OpTraffic>& per_rank) {
  const OpParts p = op_parts(net, per_rank);
  return p.alpha_ms + p.beta_ms;
}

StepPrediction predict_step(const Network& net, const TrafficPerStep& traffic, int world_size,
                            double compute_ms, Overlap overlap,
                            const std::vector<std::string>& overlapped_ops, int cores,
                            const std::vector<double>& sizes, int max_in_flight,
                            int64_t micro_batches) {
  check_network(net);
  RZ_CHECK(micro_batches >= 1, "predict_step: " << micro_batches << " micro-batches per step");
  RZ_CHECK(world_size >= 1, "predict_step: world_size " << world_size << " < 1");
  RZ_CHECK(cores >= 0, "--net-cores " << cores << " must be >= 0 (0: not given)");
  RZ_CHECK(compute_ms >= 0 && std::isfinite(compute_ms),
           "compute time " << compute_ms
                           << " ms: give --net-compute-ms >= 0, the step time of this chapter "
                              "at N = 1 on one rank's share of the batch");
  StepPrediction p;
  p.compute_ms = compute_ms;
  p.overlap = overlap;
  // With K micro-batches, DDP/ZeRO-1/2 communicate during the last one's backward only.
  const double f = overlappable_fraction(overlap) /
                   (overlap == Overlap::backward ? static_cast<double>(micro_batches) : 1.0);
  // One pass over the operations: each one's time, and the parts the replay schedules.
  std::vector<OpParts> overlapped_parts, gather_parts, reduce_scatter_parts;
  double replayed_comm_ms = 0;  // the operations the replay schedules
  for (const auto& [op, per_rank] : traffic) {
    if (op == "metrics") continue;  // the loss all-reduce is modelled below; reports are not steps
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
    if (overlap == Overlap::backward) {
      overlapped_parts.push_back(parts);
      replayed_comm_ms += ms;
    } else {  // ZeRO-3's prefetch: the gathers and the reduce-scatters, layer by layer
      const bool gather = op.find("all_gather") != std::string::npos;
      const bool scatter = op.find("reduce_scatter") != std::string::npos;
      if (gather) gather_parts.push_back(parts);
      if (scatter) reduce_scatter_parts.push_back(parts);
      if (gather || scatter) replayed_comm_ms += ms;
    }
  }
  if (world_size > 1) {
    const double loss_ms = std::ceil(std::log2(world_size)) * net.alpha_us * 1e-3;
    p.ops_ms.emplace_back("loss all-reduce", loss_ms);
    p.comm_ms += loss_ms;
  }
  p.serial_ms = compute_ms + p.comm_ms;
  // The replay, where the chapter named its collectives and the counters agree with them.
  const double n = static_cast<double>(sizes.size());
  auto calls_are = [](const std::vector<OpParts>& parts, double calls) {
    if (parts.empty()) return false;
    for (const OpParts& q : parts)
      if (std::llround(q.calls) != std::llround(calls)) return false;
    return true;
  };
  if (!sizes.empty() && overlap == Overlap::backward && calls_are(overlapped_parts, n)) {
    p.replayed = true;
    p.overlapped_ms = (1 - f) * compute_ms +
                      replay_backward_buckets(f * compute_ms, sizes,
                                              per_collective_ms(overlapped_parts, sizes, 1),
                                              max_in_flight) +
                      (p.comm_ms - replayed_comm_ms);
  } else if (!sizes.empty() && overlap == Overlap::forward_and_backward &&
             calls_are(gather_parts, 2 * n) && calls_are(reduce_scatter_parts, n)) {
    p.replayed = true;
    // Forward one third of the compute, backward two thirds (see overlappable_fraction).
    p.overlapped_ms = replay_zero3_prefetch(compute_ms / 3, 2 * compute_ms / 3, sizes,
                                            per_collective_ms(gather_parts, sizes, 2),
                                            per_collective_ms(reduce_scatter_parts, sizes, 1)) +
                      (p.comm_ms - replayed_comm_ms);
  } else if (p.overlapped_comm_ms == 0) {
    p.overlapped_ms = p.serial_ms;
  } else {
    const double ov = p.overlapped_comm_ms, after = p.comm_ms - ov;
    const double last = ov / static_cast<double>(std::max<int64_t>(1, p.collectives));
    p.overlapped_ms = (1 - f) * compute_ms + std::max(f * compute_ms, ov - last) + last + after;
  }
  p.cores = cores;
  p.ranks = world_size;
  p.overlap_possible = cores == 0 || cores > world_size;
  p.predicted_ms = p.overlap_possible ? p.overlapped_ms : p.serial_ms;
  return p;
}

TrafficPerStep traffic_per_step(const nlohmann::json& comm_per_rank, int64_t steps) {
  RZ_CHECK(steps >= 1, "traffic_per_step: " << steps << " steps; the run made no optimizer step");
  RZ_CHECK(comm_per_rank.is_array(), "traffic_per_step: expected one entry per rank");
  TrafficPerStep out;
  const size_t ranks = comm_per_rank.size();
  for (size_t r = 0; r < ranks; ++r) {
    const nlohmann::json& entry = comm_per_rank[r];
    RZ_CHECK(entry.contains("ops"), "traffic_per_step: rank " << r << "'s entry has no \"ops\"");
    for (const auto& [op, c] : entry.at("ops").items()) {
      std::vector<OpTraffic>& v = out[op];
      v.resize(ranks);
      const double n = static_cast<double>(steps);
      v[r] = {c.at("calls").get<double>() / n, c.at("messages_sent").get<double>() / n,
              c.at("bytes_sent").get<double>() / n, c.at("messages_received").get<double>() / n,
              c.at("bytes_received").get<double>() / n};
    }
  }
  return out;
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

std::string format_network(const Network& net) {
  return fmt("network: alpha %.1f us, beta %.3f Gbit/s per link", net.alpha_us,
             net.bandwidth_gbps) +
         (net.fabric_gbps > 0 ? fmt(", fabric %.3f Gbit/s (every link at once)", net.fabric_gbps)
                              : std::string());
}

std::string format_prediction(const StepPrediction& p, double measured_ms) {
  std::string s = fmt("step time: predicted %.1f ms (compute %.1f + communication %.1f ms",
                      p.predicted_ms, p.compute_ms, p.comm_ms);
  s += std::string(", overlap ") + overlap_name(p.overlap);
  if (p.overlap != Overlap::none && p.overlap_possible)
    s += std::string(p.replayed ? "; replayed per collective" : "") +
         fmt("; %.1f ms of it overlapped; without overlap %.1f ms", p.overlapped_comm_ms,
             p.serial_ms);
  else if (p.overlap != Overlap::none)
    s +=
        fmt(", not possible: %.0f ranks share %.0f cores, none free for the communication "
            "thread; with a core to spare %.1f ms",
            static_cast<double>(p.ranks), static_cast<double>(p.cores), p.overlapped_ms);
  s += fmt(") | measured %.1f ms (measured / predicted %.2f)", measured_ms,
           p.predicted_ms > 0 ? measured_ms / p.predicted_ms : 0.0);
  for (const auto& [op, ms] : p.ops_ms) s += "\n  " + op + fmt(": %.2f ms", ms);
  return s;
}

nlohmann::json prediction_json(const StepPrediction& p) {
  nlohmann::json ops = nlohmann::json::object();
  for (const auto& [op, ms] : p.ops_ms) ops[op] = ms;
  return {{"predicted_ms_per_step", p.predicted_ms},
          {"compute_ms", p.compute_ms},
          {"comm_ms", p.comm_ms},
          {"serial_ms", p.serial_ms},
          {"overlap", overlap_name(p.overlap)},
          {"overlap_possible", p.overlap_possible},
          {"overlapped_ms_per_step", p.overlapped_ms},
          {"cores", p.cores},
          {"replayed", p.replayed},
          {"ops_ms", ops}};
}

Network network_from_selftest(const std::string& path) {
  // A FIFO (--net-selftest <(ssh node cat selftest.json)) or a device would block the read.
  RZ_CHECK(!std::filesystem::exists(path) || std::filesystem::is_regular_file(path),
           "--net-selftest " << path
                             << " is not a regular file (a pipe, device or directory); save "
                                "scripts/cluster selftest's JSON to a file and give its path");
  std::ifstream in(path);
  RZ_CHECK(in, "cannot read the selftest file '"
                   << path
                   << "': run scripts/cluster selftest, which "
                      "writes /run/ringzero-cluster/<name>/selftest.json");
  // Each key once, nested at most 64 deep (its error messages print values).
  const nlohmann::json j = parse_json_unique_keys(
      std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()),
      "selftest file " + path);
  RZ_CHECK(j.is_object() && j.contains("latency_us") && j.contains("bandwidth_bps"),
           "selftest file '" << path << "' lacks latency_us or bandwidth_bps");
  for (const char* field : {"latency_us", "bandwidth_bps"})
    RZ_CHECK(j[field].is_number() && std::isfinite(j[field].get<double>()),
             "selftest file '" << path << "': field " << field << " is " << j[field].dump()
                               << ", not a finite number; rerun scripts/cluster selftest");
  Network net{j.at("latency_us").get<double>(), j.at("bandwidth_bps").get<double>() / 1e9};
  RZ_CHECK(net.bandwidth_gbps > 0, "selftest file '" << path << "': field bandwidth_bps is "
                                                     << j["bandwidth_bps"].dump()
                                                     << ", must be > 0; rerun scripts/cluster "
                                                        "selftest");
  RZ_CHECK(net.alpha_us >= 0, "selftest file '"
                                  << path << "': field latency_us is " << j["latency_us"].dump()
                                  << ", must be >= 0; rerun scripts/cluster selftest");
  if (j.contains("fabric_bps")) {  // every link busy at once (the selftest's ring)
    const nlohmann::json& fabric = j["fabric_bps"];
    RZ_CHECK(fabric.is_number() && std::isfinite(fabric.get<double>()) && fabric.get<double>() > 0,
             "selftest file '" << path << "': field fabric_bps is " << fabric.dump()
                               << ", not a number > 0; rerun scripts/cluster selftest");
    net.fabric_gbps = fabric.get<double>() / 1e9;
  }
  return net;
}

}  // namespace ringzero
