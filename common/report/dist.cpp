#include "common/report/dist.hpp"

#include <algorithm>
#include <cstdio>

#include "common/core/check.hpp"
#include "common/report/metrics.hpp"

namespace ringzero {

TrafficTheory mpi_all_reduce_traffic(int64_t psi, int world_size) {
  return {std::vector<int64_t>(world_size, 4 * psi), std::vector<int64_t>(world_size, 4 * psi),
          "MPI_Allreduce: the counters show the Ψ·4 = " + human_bytes(4.0 * psi) +
              " handed to MPI per step"};
}

nlohmann::json counters_json(const Communicator& comm) {
  nlohmann::json j = nlohmann::json::object();
  for (const auto& [op, c] : comm.counters())
    j[op] = {{"calls", c.calls},
             {"messages_sent", c.messages_sent},
             {"bytes_sent", c.bytes_sent},
             {"messages_received", c.messages_received},
             {"bytes_received", c.bytes_received}};
  return j;
}

nlohmann::json finish_setup(Communicator& comm) {
  nlohmann::json startup = counters_json(comm);
  comm.reset_counters();
  return startup;
}

namespace {

// "2676264 B (2.68 MB)": exact bytes for comparing with the formula, and a readable size.
std::string bytes_cell(double bytes) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.0f B (%s)", bytes, human_bytes(bytes).c_str());
  return buf;
}

std::string format_traffic(const std::vector<nlohmann::json>& comm, int64_t steps,
                           const TrafficTheory& theory) {
  std::string out = "communication per rank per optimizer step (" + std::to_string(steps) +
                    " steps; start-up broadcast and metrics not included):\n";
  char line[512];
  std::snprintf(line, sizeof line, "  %-4s | %-20s | %9s | %-28s | %-28s | %s\n", "rank",
                "operation", "msgs sent", "sent", "received", "theory sent / received");
  out += line;
  const double s = static_cast<double>(std::max<int64_t>(steps, 1));
  for (size_t r = 0; r < comm.size(); ++r) {
    for (const auto& [op, c] : comm[r].at("ops").items()) {
      if (op == "metrics") continue;
      std::snprintf(line, sizeof line, "  %-4zu | %-20s | %9.1f | %-28s | %-28s |\n", r, op.c_str(),
                    c.at("messages_sent").get<double>() / s,
                    bytes_cell(c.at("bytes_sent").get<double>() / s).c_str(),
                    bytes_cell(c.at("bytes_received").get<double>() / s).c_str());
      out += line;
    }
    const auto& t = comm[r].at("training");
    std::string th = "-";
    if (r < theory.bytes_sent.size())
      th = std::to_string(theory.bytes_sent[r]) + " / " + std::to_string(theory.bytes_received[r]) +
           " B";
    std::snprintf(line, sizeof line, "  %-4zu | %-20s | %9.1f | %-28s | %-28s | %s\n", r, "total",
                  t.at("messages_sent").get<double>() / s,
                  bytes_cell(t.at("bytes_sent").get<double>() / s).c_str(),
                  bytes_cell(t.at("bytes_received").get<double>() / s).c_str(), th.c_str());
    out += line;
  }
  // The start-up traffic (the initial broadcast of broadcast_and_verify_parameters), once.
  double startup_sent = 0;
  for (const auto& [op, c] : comm[0].at("startup").items())
    if (op != "metrics") startup_sent += c.at("bytes_sent").get<double>();
  return out + "  " + theory.formula + "\n  start-up, once (not above): rank 0 sent " +
         bytes_cell(startup_sent) +
         " (its initial parameters, to check every rank starts from them)";
}

}  // namespace

nlohmann::json end_of_run_report(Communicator& comm, int64_t steps, const nlohmann::json& startup,
                                 const std::string& ledger_formula, const TrafficTheory& theory) {
  const Communicator::Counters t = comm.training_traffic();
  nlohmann::json mine = {{"rank", comm.rank()},
                         {"ledger", ledger_json()},
                         {"comm",
                          {{"rank", comm.rank()},
                           {"startup", startup},
                           {"training",
                            {{"calls", t.calls},
                             {"messages_sent", t.messages_sent},
                             {"bytes_sent", t.bytes_sent},
                             {"messages_received", t.messages_received},
                             {"bytes_received", t.bytes_received}}},
                           {"ops", counters_json(comm)}}}};
  const std::vector<std::string> all = comm.gather_strings(mine.dump(), /*root=*/0);
  if (comm.rank() != 0) return {};
  std::vector<nlohmann::json> ledgers, comms;
  double model_states = 0, sent_per_step = 0;
  for (const std::string& s : all) {
    nlohmann::json j = nlohmann::json::parse(s);
    ledgers.push_back(j.at("ledger"));
    comms.push_back(j.at("comm"));
    model_states = std::max(model_states, j.at("ledger").at("model_states_peak").get<double>());
    if (steps > 0)
      sent_per_step = std::max(sent_per_step,
                               j.at("comm").at("training").at("bytes_sent").get<double>() / steps);
  }
  print0(format_ledger(ledgers, ledger_formula));
  print0(format_traffic(comms, steps, theory));
  return {{"model_states_bytes_per_rank", model_states},
          {"bytes_sent_per_rank_per_step", sent_per_step},
          {"ledger", ledgers},
          {"comm", comms}};
}

}  // namespace ringzero
