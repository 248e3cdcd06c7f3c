// Chapter 01's lesson: the training loop's body, forward, loss, backward, optimizer step.
//
// Provides: train_step(), one optimizer step on one batch, over the lesson object's optimizer in
// the run's precision (TrainingLoop::precision, training_loop.hpp); the golden test against
// PyTorch calls it. It reads only common/core/.
// Leaves out: the loop around it (common/driver/run.hpp), the reporting (training_loop.hpp).
#pragma once

#include "common/core/step.hpp"

namespace ringzero {

/// One optimizer step on one batch, step.micro_batch(0): the whole global batch (B, in).
/// Returns the batch's mean loss. Errors: a non-finite loss (check_finite_loss).
inline double train_step(Precision& precision, const Step& step) {
  Model& model = step.model;
  precision.zero_grad();                        // gradients accumulate (+=), so start from zero
  Batch batch = step.micro_batch(0);            // the whole global batch: (B, in)
  Tape tape;                                    // records what forward did, for backward
  Var loss = forward_loss(tape, model, batch);  // (B, in) -> (B, out) -> scalar
  const double loss_value = loss->value[0];
  precision.check_first_loss(loss_value, step.step);  // fp16: the forward overflowed?
  check_finite_loss(loss_value, step.step);           // stop before a NaN reaches the weights
  tape.backward(loss, precision.seed(1));  // d loss / d every parameter, into the grads
  precision.step();                        // --clip-grad-norm, then the optimizer's update
  return loss_value;
}

}  // namespace ringzero
