// Chapter 02's lesson: gradient accumulation, K micro-batches and one optimizer step.
//
// Provides: GradientAccumulation (chapter 01's TrainingLoop, training_loop.hpp, under this
// chapter's name) and train_step(), one optimizer step in K micro-steps.
// Leaves out: the loop around it (common/driver/run.hpp), the reporting (training_loop.hpp).
#pragma once

#include "chapters/01_training_loop/training_loop.hpp"
#include "common/core/check.hpp"  // exercise_stub (scripts/exercise start 02.1)
#include "common/driver/train.hpp"

namespace ringzero {

/// Chapter 01's lesson object: the same one optimizer; only the step changes.
class GradientAccumulation : public TrainingLoop {
 public:
  using TrainingLoop::TrainingLoop;
};

/// One optimizer step on the global batch, in K = grad_accum_steps micro-steps of B/K samples.
/// Returns the global batch's mean loss. Errors: a non-finite loss (check_finite_loss).
inline double train_step(GradientAccumulation& lesson, const Step& step) {
  const int64_t K = step.config.grad_accum_steps;
  Model& model = step.model;
  lesson.precision.zero_grad();  // once per optimizer step, not per micro-step: the whole trick
  double loss_sum = 0;
  for (int64_t micro_step = 0; micro_step < K; ++micro_step) {
    Batch batch = step.micro_batch(micro_step);  // (B/K, in)
    Tape tape;
    Var loss = forward_loss(tape, model, batch);  // mean over the B/K samples
    loss_sum += loss->value[0];
    // BEGIN EXERCISE 02.1 (the 1/K scaling of accumulation)
    tape.backward(loss, 1.0f / K * lesson.precision.loss_scale());  // (loss / K).backward()
    // END EXERCISE 02.1
  }
  const double loss_value = loss_sum / K;  // mean of equal-sized micro-batch means = batch mean
  lesson.precision.check_first_loss(loss_value, step.step);  // fp16: the forward overflowed?
  check_finite_loss(loss_value, step.step);  // stop before a NaN reaches the weights
  lesson.precision.step(nullptr);            // --clip-grad-norm, then the optimizer's update
  return loss_value;
}

}  // namespace ringzero
