// Chapter 04's lesson: data parallel where every rank all-reduces the gradients with the ring
// (ring.hpp) and steps its own, identical optimizer.
//
// Provides: train_step(), one optimizer step, over RingDataParallel (ring_data_parallel.hpp).
// Leaves out: the ring itself (ring.hpp), the reporting (ring_data_parallel.hpp).
#pragma once

#include "chapters/04_ring_allreduce/ring_data_parallel.hpp"
#include "common/checks/finite_check.hpp"
#include "common/driver/dist_eval.hpp"  // global_mean
#include "common/driver/train.hpp"

namespace ringzero {

/// One optimizer step on the global batch: K micro-steps on this rank's share, the all-reduce,
/// and the same optimizer step on every rank. Returns the global batch's mean loss (on every
/// rank). Errors: a non-finite loss stops every rank.
inline double train_step(RingDataParallel& dp, const Step& step) {
  const int64_t K = step.grad_accum_steps;
  Model& model = step.model;
  Communicator& comm = dp.comm;
  dp.precision.zero_grad();
  double loss_sum = 0;
  for (int64_t micro_step = 0; micro_step < K; ++micro_step) {
    Batch batch = step.micro_batch(micro_step);  // (B/(N K), in)
    Tape tape;
    Var loss = forward_loss(tape, model, batch);  // mean over this micro-batch
    loss_sum += loss->value[0];
    tape.backward(loss, dp.precision.seed(K));  // grads += dloss/K: the mean over this share
  }
  const double loss_value = global_mean(comm, loss_sum / K);  // equal shares: mean of means
  dp.precision.check_first_loss(loss_value, step.step);       // fp16: the forward overflowed?
  // Every rank stops together; the error names the rank(s) whose loss is not finite.
  check_finite_loss(comm, loss_sum / K, loss_value, step.step);

  // Σ over ranks, then / N: identical gradients, bit for bit, on every rank.
  dp.precision.reduce([&](auto grads, auto scratch) {
    all_reduce_gradients(comm, model, dp.ring, grads, scratch);
  });
  dp.precision.step(&comm);  // the same step everywhere (--clip-grad-norm first)
  return loss_value;
}

}  // namespace ringzero
