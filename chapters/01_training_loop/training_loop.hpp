// Chapter 01's lesson: the training loop's body, forward, loss, backward, optimizer step.
//
// Provides: TrainingLoop, the lesson object of one process (the model's one optimizer), and
// train_step(), one optimizer step on one batch; the golden test against PyTorch calls it.
// Leaves out: the loop around it (epochs, logging, evaluation: common/run.hpp).
#pragma once

#include <string>

#include "common/lesson.hpp"
#include "common/metrics.hpp"
#include "common/mixed_precision.hpp"
#include "common/train.hpp"

namespace ringzero {

/// One process, one model, one optimizer: --optimizer over every parameter, in registration
/// order (torch.optim.AdamW / SGD over model.parameters()). With --precision bf16|fp16 the
/// model trains in 16 bits and `mixed` holds the fp32 master weights and AdamW's moments
/// (common/mixed_precision.hpp); `optimizer` then has no state.
class TrainingLoop : public Lesson {
 public:
  explicit TrainingLoop(SetUp& s)
      : mixed(make_mixed_precision(s.model, s.config)),
        optimizer(s.config, mixed ? std::vector<int64_t>{} : parameter_sizes(s.model)),
        states_(fp32_state_bytes(s.config.optimizer, s.config.momentum)) {}
  std::string ledger_formula(int64_t psi) const override {
    if (mixed) return MixedPrecision::ledger_formula(mixed->dtype(), psi);
    return "formula (one process, " + std::string(states_.name) +
           "): " + full_copy_formula_text(states_) + " = " +
           human_bytes(states_.per_param() * static_cast<double>(psi)) +
           " with Ψ = " + std::to_string(psi);
  }
  // In 16 bits the fp32 model existed during set-up only; the peaks start after it.
  bool reset_ledger_peaks() const override { return mixed != nullptr; }
  nlohmann::json summary_fields() const override {
    return mixed ? mixed->summary() : nlohmann::json::object();
  }
  std::map<std::string, NamedTensor> model_state_dict(const Model& model) override {
    return mixed ? mixed->master_state_dict(model) : state_dict(model);
  }

  std::unique_ptr<MixedPrecision> mixed;  ///< null in fp32
  TrainingState training_state(Model& model) override {
    return replicated_state(model, &optimizer, "");
  }

  Optimizer optimizer;

 private:
  StateBytes states_;  ///< bytes per parameter in fp32: p, g and --optimizer's state
};

/// train_step in 16 bits: the same step with the loss scaled (fp16), 16-bit gradients, and the
/// master weights' update (which may skip the step in fp16, on overflow).
inline double train_step_mixed(MixedPrecision& mixed, const Step& step, float seed) {
  const int64_t K = step.config.grad_accum_steps;
  mixed.zero_grad();
  double loss_sum = 0;
  for (int64_t micro_step = 0; micro_step < K; ++micro_step) {
    Batch batch = step.micro_batch(micro_step);
    Tape tape;
    Var loss = forward_loss(tape, step.model, batch);
    loss_sum += loss->value[0];
    tape.backward(loss, seed * mixed.loss_scale());
  }
  const double loss_value = loss_sum / static_cast<double>(K);
  mixed.check_first_loss(loss_value, step.step);  // fp16: the forward overflowed at step 1?
  check_finite_loss(loss_value, step.step);
  mixed.step(step.config.clip_grad_norm, nullptr);
  return loss_value;
}

/// One optimizer step on one batch, step.micro_batch(0): the whole global batch (B, in).
/// Returns the batch's mean loss. Errors: a non-finite loss (check_finite_loss).
inline double train_step(TrainingLoop& loop, const Step& step) {
  if (loop.mixed) return train_step_mixed(*loop.mixed, step, 1.0f);
  Model& model = step.model;
  model.zero_grad();                            // gradients accumulate (+=), so start from zero
  Batch batch = step.micro_batch(0);            // the whole global batch: (B, in)
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
