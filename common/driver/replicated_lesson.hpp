// replicated_lesson: the Lesson of chapters whose ranks each hold the whole model in a
// ReplicatedPrecision (01 and 02 on one process, 03's central reducer, 04's ring): what the
// driver reports and saves of it (ledger peaks, summary fields, --save-final, checkpoints) is
// the precision's, written once here.
// Leaves out: the chapter's idea (its banner, ledger formula and traffic: the chapter's lesson
// object) and the engines of chapters 05-08 (engine_lesson.hpp).
#pragma once

#include <nlohmann/json.hpp>

#include <map>
#include <string>

#include "common/core/nn.hpp"
#include "common/driver/config.hpp"
#include "common/driver/lesson.hpp"
#include "common/precision/precision.hpp"

namespace ringzero {

/// A Lesson over one ReplicatedPrecision: `precision` holds the parameters' dtype, the
/// gradients and (where this rank steps) the optimizer; the reporting and state overrides
/// below are its. A chapter derives from it and adds its theory.
class ReplicatedLesson : public Lesson {
 public:
  /// world_size: N (the mean's divisor); holds_optimizer: false on ranks that do not step
  /// (chapter 03's ranks 1..N-1). Errors: as ReplicatedPrecision's.
  ReplicatedLesson(Model& model, const TrainConfig& config, int world_size,
                   bool holds_optimizer = true)
      : precision(model, config, world_size, holds_optimizer) {}

  bool reset_ledger_peaks() const override { return precision.reset_ledger_peaks(); }
  nlohmann::json summary_fields() const override { return precision.summary(); }
  std::map<std::string, NamedTensor> model_state_dict(const Model& model) override {
    return precision.state_dict(model);
  }
  TrainingState training_state(Model& model) override { return precision.training_state(model); }

  ReplicatedPrecision precision;  ///< the parameters' dtype, the gradients and the optimizer
};

}  // namespace ringzero
