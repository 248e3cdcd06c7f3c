// dist: the plumbing every distributed chapter (03-08) shares, so that main.cpp shows only its
// lesson: which samples this rank trains on, the start-up check that every rank holds rank 0's
// initial parameters, evaluation split across ranks, the global-batch loss, and the end-of-run
// report (memory ledger and communication per rank, each beside its formula).
//
// Every number a rank prints or logs here is reduced over ranks first, so every rank reports
// the same loss and accuracy, equal to what one process computes on the same weights.
// Leaves out: the gradient communication itself (each chapter writes it out, it is the
// lesson), and anything about devices.
#pragma once

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "comm.hpp"
#include "data.hpp"
#include "nn.hpp"
#include "train.hpp"

namespace ringzero {

/// parse_flags() for a job of several ranks: every rank learns whether every other rank parsed
/// its command line. A flag error on one rank only (it printed CLI11's message and would exit)
/// aborts every rank, instead of leaving the others waiting in their first collective.
/// Returns like parse_flags: an exit code to return now (all ranks saw --help, or all failed),
/// or -1 to carry on.
int parse_flags_on_every_rank(Communicator& comm, CLI::App& app, int argc, char** argv);

/// Start-up, before any other collective: checks that every rank parsed the same flags, and
/// aborts every rank naming the first flag that differs, with rank 0's value and the other
/// rank's ("rank 2 has lr=0.002, rank 0 has lr=0.001"). A job whose ranks train with different
/// learning rates, batch sizes or step counts either hangs in a collective or, worse, trains
/// on silently; PyTorch DDP has no such check and leaves it to the launcher. Flags named in
/// `checked_elsewhere` (e.g. "seed", verified through the parameters themselves) are skipped,
/// so the chapter's own check stays the one that reports them.
void verify_same_flags(Communicator& comm, const CLI::App& app,
                       const std::vector<std::string>& checked_elsewhere);

/// The samples rank `rank` trains on at `micro_step` of global batch t: chunk
/// rank * grad_accum_steps + micro_step of world_size * grad_accum_steps equal pieces
/// (docs/design.md, "Samples per step depend only on (seed, epoch, t)"). Ranks and micro-steps only
/// cut the same global batch, so the set of samples of step t does not depend on world_size or
/// grad_accum_steps.
std::span<const int64_t> rank_micro_batch(const Sampler& sampler, int64_t t, int rank,
                                          int world_size, int64_t grad_accum_steps,
                                          int64_t micro_step);

/// Start-up: broadcasts rank 0's parameters (Communicator::broadcast) and checks, on every
/// rank, that they equal the parameters this rank built itself (bit for bit). A rank started
/// with other weights (another --seed or --init-from) means a bug in the launch, not something
/// to paper over: every rank aborts, with a message naming the mismatching rank(s), the first
/// differing element and the fix. Same as PyTorch DDP's constructor, which broadcasts rank 0's
/// module state (and verifies the parameter shapes match across ranks).
void broadcast_and_verify_parameters(Communicator& comm, Model& model);

/// The test samples [begin, end) that `rank` evaluates. The test set is cut at multiples of
/// kEvalBatchSize (train.hpp), whole evaluation batches to each rank, so every sample is
/// counted exactly once (whatever world_size: 10 000 does not divide by 3) and each batch is the
/// batch one process would run: distributed results equal single-process ones exactly.
std::pair<int64_t, int64_t> eval_range(int64_t test_size, int rank, int world_size);

struct EvalResult {
  double test_loss = 0;       ///< mean over the whole test set
  double test_accuracy = -1;  ///< fraction correct; -1 for regression
};
/// Sums each rank's evaluation of its eval_range over ranks (all_reduce_metrics): every rank
/// returns the whole-test-set numbers. Errors: the ranks' counts do not add up to the test set.
EvalResult reduce_eval(Communicator& comm, const EvalSums& local, const Dataset& test);

/// Evaluates this rank's eval_range and sums (loss, correct, count) over ranks with
/// all_reduce_metrics: every rank returns the same, whole-test-set numbers.
EvalResult evaluate_distributed(Communicator& comm, Model& model, const Dataset& test);

/// Mean over ranks of one value per rank (each rank's mean loss over its equal share of the
/// global batch gives the global-batch mean loss), identical on every rank.
double global_mean(Communicator& comm, double local_value);

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
