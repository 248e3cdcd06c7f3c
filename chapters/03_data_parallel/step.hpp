// Chapter 03's lesson: data parallel, every rank's gradients summed on rank 0, which steps and
// sends the new parameters back (central_reducer.hpp).
//
// Provides: train_step(), one optimizer step, over CentralReducer (central_reducer.hpp).
// Leaves out: the reducer and broadcast themselves and the reporting (central_reducer.hpp).
#pragma once

#include "chapters/03_data_parallel/central_reducer.hpp"
#include "common/checks/finite_check.hpp"
#include "common/driver/dist_eval.hpp"  // global_mean
#include "common/driver/train.hpp"

namespace ringzero {

/// One optimizer step on the global batch: K micro-steps on this rank's share, then the
/// central reducer. Returns the global batch's mean loss (on every rank). Errors: a non-finite
/// loss stops every rank (check_finite_loss: the global mean is the same everywhere; the error
/// names the rank(s) whose own loss is not finite).
inline double train_step(CentralReducer& reducer, const Step& step) {
  const int64_t K = step.grad_accum_steps;
  Model& model = step.model;
  Communicator& comm = reducer.comm;
  reducer.precision.zero_grad();
  double loss_sum = 0;
  for (int64_t micro_step = 0; micro_step < K; ++micro_step) {
    Batch batch = step.micro_batch(micro_step);  // (B/(N K), in)
    Tape tape;
    Var loss = forward_loss(tape, model, batch);  // mean over this micro-batch
    loss_sum += loss->value[0];
    tape.backward(loss, reducer.precision.seed(K));  // grads += dloss/K: this share's mean
  }
  const double loss_value = global_mean(comm, loss_sum / K);  // equal shares: mean of means
  reducer.precision.check_first_loss(loss_value, step.step);  // fp16: the forward overflowed?
  // Every rank stops together; the error names the rank(s) whose loss is not finite.
  check_finite_loss(comm, loss_sum / K, loss_value, step.step);

  // Rank 0: Σ over ranks of the share means, then / N (mean of N equal shares = global mean).
  reducer.precision.reduce(
      [&](auto grads, auto scratch) { reduce_to_rank0(comm, grads, scratch); });
  reducer.precision.step(&comm, /*holds_sum=*/comm.rank() == 0);  // rank 0 alone steps
  // Everyone continues from rank 0's weights.
  reducer.precision.visit_params([&](auto params) { broadcast_from_rank0(comm, params); });
  return loss_value;
}

}  // namespace ringzero
