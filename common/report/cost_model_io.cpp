// The cost model's inputs and outputs (common/report/cost_model.hpp): the counters per step
// and the selftest's network read in, the prediction written out as text and JSON.
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "common/core/check.hpp"
#include "common/io/safetensors.hpp"
#include "common/report/cost_model.hpp"

namespace ringzero {

namespace {
/// printf's `format` with up to four numbers, as a string (at most 255 characters).
std::string fmt(const char* format, double a, double b = 0, double c = 0, double d = 0) {
  char buf[256];
  std::snprintf(buf, sizeof buf, format, a, b, c, d);
  return buf;
}
}  // namespace

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
