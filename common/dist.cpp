#include "dist.hpp"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <sstream>

#include "check.hpp"
#include "metrics.hpp"
#include "train.hpp"

namespace ringzero {

std::span<const int64_t> rank_micro_batch(const Sampler& sampler, int64_t t, int rank,
                                          int world_size, int64_t grad_accum_steps,
                                          int64_t micro_step) {
  return sampler.chunk(t, rank * grad_accum_steps + micro_step, world_size * grad_accum_steps);
}

void broadcast_and_verify_parameters(Communicator& comm, Model& model) {
  const int N = comm.world_size(), r = comm.rank();
  std::span<float> params = model.params_memory.span();
  // In pieces, so the check costs a small fixed buffer rather than a second copy of the model.
  constexpr int64_t kPiece = int64_t{1} << 16;
  Buffer received(std::min(kPiece, model.num_parameters()),
                  MemTag::comm_buffers);  // (piece) rank 0's values
  int64_t first = -1;
  float mine_at_first = 0, rank0_at_first = 0;
  for (auto [off, n] : split_count(model.num_parameters(), kPiece)) {
    std::span<float> piece = received.span().first(static_cast<size_t>(n));
    std::copy_n(params.begin() + off, n, piece.begin());
    comm.broadcast(piece, /*root=*/0);
    // Bit for bit: the same seed and code give the same bits, and anything else is a launch bug.
    for (int64_t i = 0; i < n && first < 0; ++i)
      if (std::memcmp(&piece[i], &params[off + i], sizeof(float)) != 0) {
        first = off + i;
        mine_at_first = params[off + i];
        rank0_at_first = piece[i];
      }
  }
  std::vector<double> mismatch(static_cast<size_t>(N), 0.0);  // (N) 1 where a rank differs
  mismatch[r] = first >= 0 ? 1.0 : 0.0;
  comm.all_reduce_metrics(mismatch);
  std::string ranks;
  for (int q = 0; q < N; ++q)
    if (mismatch[q] != 0) ranks += (ranks.empty() ? "" : ", ") + std::to_string(q);
  if (ranks.empty()) return;
  const int reporter =
      static_cast<int>(std::find(mismatch.begin(), mismatch.end(), 1.0) - mismatch.begin());
  if (r != reporter) {
    comm.barrier();  // never completes: the reporter aborts every rank (one message, not N)
    return;
  }
  std::string where = "element " + std::to_string(first);
  for (size_t p = 0; p < model.parameters().size(); ++p) {
    const int64_t off = model.offsets()[p], n = model.parameters()[p]->numel();
    if (first >= off && first < off + n)
      where = model.parameters()[p]->name() + "[" + std::to_string(first - off) + "]";
  }
  RZ_CHECK(
      false,
      "rank(s) " << ranks
                 << " started with initial parameters different from rank 0's (first difference "
                 << "on rank " << r << " at " << where << ": " << mine_at_first << " here, "
                 << rank0_at_first << " on rank 0); every rank must build the model from the "
                 << "same --seed and --init-from: launch all ranks with the same command line");
}

std::pair<int64_t, int64_t> eval_range(int64_t test_size, int rank, int world_size) {
  const int64_t batches = (test_size + kEvalBatchSize - 1) / kEvalBatchSize;
  // Rank r takes batches [r B / N, (r+1) B / N): shares differ by at most one batch.
  const int64_t b0 = batches * rank / world_size, b1 = batches * (rank + 1) / world_size;
  return {std::min(test_size, b0 * kEvalBatchSize), std::min(test_size, b1 * kEvalBatchSize)};
}

EvalResult evaluate_distributed(Communicator& comm, Model& model, const Dataset& test) {
  const auto [begin, end] = eval_range(test.size, comm.rank(), comm.world_size());
  return reduce_eval(comm, evaluate(model, test, begin, end), test);
}

EvalResult reduce_eval(Communicator& comm, const EvalSums& e, const Dataset& test) {
  // The per-batch loss sums are float * batch size, exact in double; their sum over at most a
  // few dozen batches stays exact too, so the reduction order does not change the result.
  std::vector<double> sums = {e.loss_sum, e.correct, e.count};
  comm.all_reduce_metrics(sums);
  RZ_CHECK(sums[2] == static_cast<double>(test.size), "evaluation counted "
                                                          << sums[2] << " test samples, expected "
                                                          << test.size << "; eval_range is wrong");
  EvalResult out;
  out.test_loss = sums[0] / sums[2];
  if (test.classification()) out.test_accuracy = sums[1] / sums[2];
  return out;
}

double global_mean(Communicator& comm, double local_value) {
  std::vector<double> v = {local_value};
  comm.all_reduce_metrics(v);
  return v[0] / comm.world_size();
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

int parse_flags_on_every_rank(Communicator& comm, CLI::App& app, int argc, char** argv) {
  const int rc = parse_flags(app, argc, argv);
  std::vector<double> stopping = {rc >= 0 ? 1.0 : 0.0};
  comm.all_reduce_metrics(stopping);
  if (stopping[0] == 0 || stopping[0] == comm.world_size()) return rc;
  return run_main([&]() -> int {
    RZ_CHECK(false,
             (rc >= 0 ? "this rank stops at its flag error or --help (above)"
                      : "a flag error on another rank (its message is above) stops this one too")
                 << "; every rank must run the same command line");
    return 1;
  });
}

void verify_same_flags(Communicator& comm, const CLI::App& app,
                       const std::vector<std::string>& checked_elsewhere) {
  // One "name=value" line per option, defaults included, in registration order: the same text
  // on every rank exactly when the parsed flags are the same, whatever their spelling on argv.
  std::string mine;
  std::istringstream lines(app.config_to_str(/*default_also=*/true, /*write_description=*/false));
  for (std::string line; std::getline(lines, line);) {
    const std::string name = line.substr(0, line.find('='));
    if (std::find(checked_elsewhere.begin(), checked_elsewhere.end(), name) ==
        checked_elsewhere.end())
      mine += line + "\n";
  }
  const std::vector<std::string> all = comm.gather_strings(mine, 0);
  std::string verdict;  // empty: all equal
  for (size_t r = 1; r < all.size() && verdict.empty(); ++r) {
    if (all[r] == all[0]) continue;
    std::istringstream a(all[0]), b(all[r]);
    std::string la, lb;
    while (std::getline(a, la) && std::getline(b, lb) && la == lb) {
    }
    verdict = "rank " + std::to_string(r) + " has " + (lb.empty() ? "other flags" : lb) +
              ", rank 0 has " + (la.empty() ? "other flags" : la) +
              "; every rank must run the same command line";
  }
  comm.broadcast_string(verdict, 0);  // every rank stops, with the same message
  RZ_CHECK(verdict.empty(), verdict);
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
