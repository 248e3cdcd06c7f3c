// dist: the end-of-run report of a distributed chapter (03-08): the memory ledger and the
// communication of every rank gathered on rank 0, each beside its formula, and the traffic
// theory a lesson states (TrafficTheory).
// Leaves out: the start-up checks (dist_config.hpp), evaluation and the loss (dist_eval.hpp),
// the gradient communication itself (each chapter writes it out, it is the lesson).
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include "common/comm/comm.hpp"

namespace ringzero {

/// This rank's counters as JSON: {"<op>": {calls, messages_sent, bytes_sent, messages_received,
/// bytes_received}, ...}.
nlohmann::json counters_json(const Communicator& comm);

/// Ends set-up: returns the start-up traffic (the initial broadcast) and resets the counters,
/// so that the counters at the end of the run are the training steps' traffic only.
nlohmann::json finish_setup(Communicator& comm);

/// What each rank should move per optimizer step, for the traffic table.
struct TrafficTheory {
  std::vector<int64_t> bytes_sent, bytes_received;  ///< per rank, per optimizer step
  std::string formula;                              ///< printed under the table
};

/// What MPI_Allreduce of Ψ fp32 gradients moves per step as the counters see it: the Ψ·4 bytes
/// handed to it, on every rank (MPI does not report its wire traffic); chapters 04-05's theory
/// under --collectives mpi.
TrafficTheory mpi_all_reduce_traffic(int64_t psi, int world_size);

/// End-of-run report, collective. Gathers every rank's ledger_json() and counters on rank 0,
/// prints the per-rank memory ledger beside `ledger_formula` and the per-rank traffic per
/// optimizer step (per operation, and the total beside `theory`), and returns, on rank 0, the
/// summary fields ({} on other ranks): model_states_bytes_per_rank and
/// bytes_sent_per_rank_per_step (the largest over ranks: the bottleneck rank), ledger and comm
/// (per rank: {"rank", "startup", "training", "ops"}). `steps` is the number of optimizer
/// steps the counters cover; `startup` is finish_setup()'s result.
nlohmann::json end_of_run_report(Communicator& comm, int64_t steps, const nlohmann::json& startup,
                                 const std::string& ledger_formula, const TrafficTheory& theory);

}  // namespace ringzero
