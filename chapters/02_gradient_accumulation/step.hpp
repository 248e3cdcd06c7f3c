// Chapter 02's lesson: gradient accumulation, K micro-batches and one optimizer step.
//
// Provides: train_step(), one optimizer step in K micro-steps, over chapter 01's lesson object
// (TrainingLoop, chapters/01_training_loop/training_loop.hpp): the same one optimizer; only the
// step changes.
// Leaves out: the loop around it (common/driver/run.hpp), the reporting (training_loop.hpp).
#pragma once

#include "common/core/check.hpp"  // exercise_stub (scripts/exercise start 02.1)
#include "common/core/step.hpp"

namespace ringzero {

/// One optimizer step on the global batch, in K = grad_accum_steps micro-steps of B/K samples.
/// Returns the global batch's mean loss. Errors: a non-finite loss (check_finite_loss).
inline double train_step(Precision& precision, const Step& step) {
  const int64_t K = step.grad_accum_steps;
  Model& model = step.model;
  precision.zero_grad();  // once per optimizer step, not per micro-step: the whole trick
  double loss_sum = 0;
  for (int64_t micro_step = 0; micro_step < K; ++micro_step) {
    Batch batch = step.micro_batch(micro_step);  // (B/K, in)
    Tape tape;
    Var loss = forward_loss(tape, model, batch);  // mean over the B/K samples
    loss_sum += loss->value[0];
    // BEGIN EXERCISE 02.1 (accumulation that equals the full batch)
    tape.backward(loss, 1.0f / K * precision.loss_scale());  // (loss / K).backward()
    // END EXERCISE 02.1
  }
  const double loss_value = loss_sum / K;  // mean of equal-sized micro-batch means = batch mean
  precision.check_first_loss(loss_value, step.step);  // fp16: the forward overflowed?
  check_finite_loss(loss_value, step.step);           // stop before a NaN reaches the weights
  precision.step();  // --clip-grad-norm, then the optimizer's update
  return loss_value;
}

}  // namespace ringzero
