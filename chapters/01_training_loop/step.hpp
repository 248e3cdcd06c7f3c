// Chapter 01's lesson: the training loop's body, forward, loss, backward, optimizer step.
//
// Provides: train_step(), one optimizer step on one batch, over TrainingLoop (the one
// optimizer: training_loop.hpp); the golden test against PyTorch calls it.
// Leaves out: the loop around it (common/driver/run.hpp), the reporting (training_loop.hpp).
#pragma once

#include "chapters/01_training_loop/training_loop.hpp"
#include "common/driver/train.hpp"

namespace ringzero {

/// One optimizer step on one batch, step.micro_batch(0): the whole global batch (B, in).
/// Returns the batch's mean loss. Errors: a non-finite loss (check_finite_loss).
inline double train_step(TrainingLoop& lesson, const Step& step) {
  Model& model = step.model;
  lesson.precision.zero_grad();                 // gradients accumulate (+=), so start from zero
  Batch batch = step.micro_batch(0);            // the whole global batch: (B, in)
  Tape tape;                                    // records what forward did, for backward
  Var loss = forward_loss(tape, model, batch);  // (B, in) -> (B, out) -> scalar
  const double loss_value = loss->value[0];
  lesson.precision.check_first_loss(loss_value, step.step);  // fp16: the forward overflowed?
  check_finite_loss(loss_value, step.step);       // stop before a NaN reaches the weights
  tape.backward(loss, lesson.precision.seed(1));  // d loss / d every parameter, into the grads
  lesson.precision.step(nullptr);                 // --clip-grad-norm, then the optimizer's update
  return loss_value;
}

}  // namespace ringzero
