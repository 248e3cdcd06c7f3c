// dist_eval: the numbers every rank of a distributed chapter (03-08) reports, reduced over
// ranks first: the test-set evaluation split across ranks and the global-batch mean loss. Every
// rank then reports the same loss and accuracy, equal to what one process computes on the same
// weights (docs/design.md, "Evaluation is split, sums are reduced").
// Leaves out: the gradient communication (each chapter writes it out, it is the lesson).
#pragma once

#include <cstdint>
#include <utility>

#include "common/comm/comm.hpp"
#include "common/core/nn.hpp"
#include "common/data/data.hpp"
#include "common/driver/train.hpp"

namespace ringzero {

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

/// evaluate_distributed for an engine whose every forward is collective (ZeRO-3 gathers each
/// layer): eval_range's shares differ by a batch (10 000 samples on 3 ranks) or are empty, so a
/// rank with fewer batches runs padding batches and drops their results (PyTorch's
/// DistributedSampler pads with repeated samples for the same reason); every rank runs as many
/// forwards as the others. The sums are evaluate_distributed's, exactly. The forwards'
/// collectives are recounted as "metrics" (Communicator::recount_as_metrics): they are not a
/// training step's traffic.
EvalResult evaluate_in_lockstep(Communicator& comm, Model& model, const Dataset& test);

/// Mean over ranks of one value per rank (each rank's mean loss over its equal share of the
/// global batch gives the global-batch mean loss), identical on every rank.
double global_mean(Communicator& comm, double local_value);

}  // namespace ringzero
