// train: the plumbing every chapter's training loop shares, so that main.cpp shows only the
// lesson: data and model set-up from the flags, batches and evaluation (the step's inputs, the
// loss and the NaN guard are common/core/step.hpp's; the optimizer, common/core/optim.hpp's).
// Leaves out: the training step itself. Forward, backward, communication and the optimizer
// step are written out in each chapter's step.hpp and the files it uses, on purpose.
#pragma once

#include <memory>
#include <span>
#include <vector>

#include "common/core/nn.hpp"
#include "common/core/optim.hpp"
#include "common/core/step.hpp"
#include "common/data/data.hpp"
#include "common/driver/config.hpp"

namespace ringzero {

struct TrainTestData {
  Dataset train, test;
};

/// Fashion-MNIST from --data-dir, or the synthetic set: 1000 training samples from
/// (seed, stream 1), plus 200 held-out samples from (seed, stream 2).
TrainTestData load_data(const TrainConfig& config);

/// The model of --model/--hidden-sizes, initialised from --seed or loaded from --init-from.
std::unique_ptr<Model> build_model(const TrainConfig& config);

/// One (micro-)batch copied out of a dataset (Batch: common/core/step.hpp).
Batch make_batch(const Dataset& ds, std::span<const int64_t> indices);

/// Sums over test samples [begin, end): Σ per-sample loss, number correct (classification).
struct EvalSums {
  double loss_sum = 0;
  double correct = 0;
  double count = 0;
};
/// evaluate() runs batches of kEvalBatchSize samples starting at `begin` (the last may be
/// shorter); distributed evaluation cuts the test set at multiples of it
/// (common/driver/dist_eval.hpp).
inline constexpr int64_t kEvalBatchSize = 500;
EvalSums evaluate(Model& model, const Dataset& test, int64_t begin, int64_t end);

/// Segment sizes of every parameter, registration order.
std::vector<int64_t> parameter_sizes(const Model& model);

/// Total optimizer steps of the run: epochs * steps_per_epoch, capped by --max-steps.
int64_t total_steps(const TrainConfig& config, int64_t steps_per_epoch);

}  // namespace ringzero
