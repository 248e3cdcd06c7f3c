// Chapter 01's lesson: the training loop's body, forward, loss, backward, optimizer step.
//
// Provides: TrainingLoop, the lesson object of one process (the model's one optimizer), and
// train_step(), one optimizer step on one batch; the golden test against PyTorch calls it.
// Leaves out: the loop around it (epochs, logging, evaluation: common/run.hpp).
#pragma once

#include <string>

#include "common/lesson.hpp"
#include "common/metrics.hpp"
#include "common/train.hpp"

namespace ringzero {

/// One process, one model, one optimizer: --optimizer over every parameter, in registration
/// order (torch.optim.AdamW / SGD over model.parameters()).
class TrainingLoop : public Lesson {
 public:
  explicit TrainingLoop(SetUp& s) : optimizer(s.config, parameter_sizes(s.model)) {}
  std::string ledger_formula(int64_t psi) const override {
    return "formula (one process, fp32 + AdamW): 4Ψ + 4Ψ + 8Ψ = 16Ψ = " + human_bytes(16.0 * psi) +
           " with Ψ = " + std::to_string(psi);
  }

  TrainingState training_state(Model& model) override {
    return replicated_state(model, &optimizer, "");
  }

  Optimizer optimizer;
};

/// One optimizer step on one batch, step.micro_batch(0): the whole global batch (B, in).
/// Returns the batch's mean loss. Errors: a non-finite loss (check_finite_loss).
inline double train_step(TrainingLoop& loop, const Step& step) {
  Model& model = step.model;
  model.zero_grad();  // gradients accumulate (+=), so start from zero
  Batch batch = step.micro_batch(0);
  Tape tape;                                    // records what forward did, for backward
  Var loss = forward_loss(tape, model, batch);  // (B, in) -> (B, out) -> scalar
  const double loss_value = loss->value[0];
  check_finite_loss(loss_value, step.step);  // stop before a NaN reaches the weights
  tape.backward(loss);                       // d loss / d every parameter, into grads_memory
  if (step.config.clip_grad_norm > 0)
    clip_grad_norm(model.grads_memory.span(), step.config.clip_grad_norm);
  loop.optimizer.step(model.params_memory.span(), model.grads_memory.span());
  return loss_value;
}

}  // namespace ringzero
