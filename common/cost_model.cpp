#include "common/cost_model.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>

#include "common/check.hpp"

namespace ringzero {

namespace {
void check_network(const Network& net) {
  RZ_CHECK(net.bandwidth_gbps > 0 && std::isfinite(net.bandwidth_gbps),
           "network bandwidth " << net.bandwidth_gbps
                                << " Gbit/s: give --net-bandwidth > 0 (Gbit/s per link), or "
                                   "--net-selftest with scripts/cluster selftest's JSON");
  RZ_CHECK(net.alpha_us >= 0 && std::isfinite(net.alpha_us),
           "network latency " << net.alpha_us << " us: give --net-alpha-us >= 0");
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

double op_time_ms(const Network& net, const std::vector<OpTraffic>& per_rank) {
  check_network(net);
  double worst = 0;
  for (const OpTraffic& t : per_rank) {
    const double messages = std::max(t.messages_sent, t.messages_received);
    const double bytes = std::max(t.bytes_sent, t.bytes_received);
    worst =
        std::max(worst, messages * net.alpha_us * 1e-3 + bytes * 8.0 / (net.bandwidth_gbps * 1e6));
  }
  return worst;
}

StepPrediction predict_step(const Network& net, const TrafficPerStep& traffic, int world_size,
                            double compute_ms, Overlap overlap) {
  check_network(net);
  RZ_CHECK(world_size >= 1, "predict_step: world_size " << world_size << " < 1");
  RZ_CHECK(compute_ms >= 0 && std::isfinite(compute_ms),
           "compute time " << compute_ms
                           << " ms: give --net-compute-ms >= 0, the step time of this chapter "
                              "at N = 1 on one rank's share of the batch");
  StepPrediction p;
  p.compute_ms = compute_ms;
  p.overlap = overlap;
  for (const auto& [op, per_rank] : traffic) {
    if (op == "metrics") continue;  // the loss all-reduce is modelled below; reports are not steps
    const double ms = op_time_ms(net, per_rank);
    double calls = 0;
    for (const OpTraffic& t : per_rank) calls = std::max(calls, t.calls);
    p.collectives = std::max(p.collectives, static_cast<int64_t>(std::llround(calls)));
    p.ops_ms.emplace_back(op, ms);
    p.comm_ms += ms;
  }
  if (world_size > 1) {
    const double loss_ms = std::ceil(std::log2(world_size)) * net.alpha_us * 1e-3;
    p.ops_ms.emplace_back("loss all-reduce", loss_ms);
    p.comm_ms += loss_ms;
  }
  p.serial_ms = compute_ms + p.comm_ms;
  const double f = overlappable_fraction(overlap);
  if (f == 0 || p.comm_ms == 0) {
    p.overlapped_ms = p.serial_ms;
  } else {
    const double last = p.comm_ms / static_cast<double>(std::max<int64_t>(1, p.collectives));
    p.overlapped_ms = (1 - f) * compute_ms + std::max(f * compute_ms, p.comm_ms - last) + last;
  }
  p.predicted_ms = p.overlapped_ms;
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

std::string format_prediction(const StepPrediction& p, double measured_ms) {
  std::string s = fmt("step time: predicted %.1f ms (compute %.1f + communication %.1f ms",
                      p.predicted_ms, p.compute_ms, p.comm_ms);
  s += std::string(", overlap ") + overlap_name(p.overlap);
  if (p.overlap != Overlap::none) s += fmt("; without overlap %.1f ms", p.serial_ms);
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
          {"ops_ms", ops}};
}

Network network_from_selftest(const std::string& path) {
  std::ifstream in(path);
  RZ_CHECK(in, "cannot read the selftest file '"
                   << path
                   << "': run scripts/cluster selftest, which "
                      "writes /run/ringzero-cluster/<name>/selftest.json");
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(in);
  } catch (const std::exception& e) {
    RZ_CHECK(false, "selftest file '" << path << "' is not JSON: " << e.what());
  }
  RZ_CHECK(j.contains("latency_us") && j.contains("bandwidth_bps"),
           "selftest file '" << path << "' lacks latency_us or bandwidth_bps");
  Network net{j.at("latency_us").get<double>(), j.at("bandwidth_bps").get<double>() / 1e9};
  check_network(net);
  return net;
}

}  // namespace ringzero
