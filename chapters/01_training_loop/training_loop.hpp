// Chapter 01's lesson object: one process, one model, one optimizer.
//
// Provides: TrainingLoop, the lesson object of one process (the model's one optimizer and what
// the run reports and saves of it); chapter 02 reuses it.
// Leaves out: the step (step.hpp), the loop around it (epochs, logging, evaluation:
// common/driver/run.hpp).
#pragma once

#include <string>

#include "common/driver/replicated_lesson.hpp"
#include "common/driver/train.hpp"
#include "common/report/metrics.hpp"

namespace ringzero {

/// One process, one model, one optimizer: --optimizer over every parameter, in registration
/// order (torch.optim.AdamW / SGD over model.parameters()). `precision` holds it: in fp32 the
/// model's own buffers and that optimizer; with --precision bf16|fp16 the 16-bit model, the
/// fp32 master weights and AdamW's moments (common/precision/precision.hpp).
class TrainingLoop : public ReplicatedLesson {
 public:
  explicit TrainingLoop(SetUp& s)
      : ReplicatedLesson(s.model, s.config, /*world_size=*/1),
        states_(fp32_state_bytes(s.config.optimizer, s.config.momentum)) {}
  std::string ledger_formula(int64_t psi) const override {
    if (!precision.is_fp32()) return MixedPrecision::ledger_formula(precision.dtype(), psi);
    return "formula (one process, " + std::string(states_.name) +
           "): " + full_copy_formula_text(states_) + " = " +
           human_bytes(states_.per_param() * static_cast<double>(psi)) +
           " with Ψ = " + std::to_string(psi);
  }
 private:
  StateBytes states_;  ///< bytes per parameter in fp32: p, g and --optimizer's state
};

}  // namespace ringzero
