// replicated_lesson: the Lesson of chapters whose ranks each hold the whole model in a
// ReplicatedPrecision (01 and 02 on one process, 03's central reducer, 04's ring): what the
// driver reports and saves of it (ledger peaks, summary fields, --save-final, checkpoints) is
// the precision's, written once here.
// Leaves out: the chapter's idea (its ledger formula and traffic: the chapter's lesson
// object) and the engines of chapters 05-08 (engine_lesson.hpp).
#pragma once

#include <nlohmann/json.hpp>

#include <map>
#include <optional>
#include <string>

#include "common/core/nn.hpp"
#include "common/driver/config.hpp"
#include "common/driver/engine_description.hpp"
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
  /// " | collectives ring" (or mpi) where every rank takes part in the reduction (chapter 04's
  /// description()); nothing where rank 0 reduces alone (chapter 03) or nothing is described.
  std::string banner() const override {
    const std::optional<EngineDescription> d = description();
    return d && !d->central ? std::string(" | collectives ") + collectives_name(d->collectives)
                            : "";
  }
  /// The precision's fields, and "collectives" where the banner shows them.
  nlohmann::json summary_fields() const override {
    nlohmann::json j = precision.summary();
    if (const std::optional<EngineDescription> d = description(); d && !d->central)
      j["collectives"] = collectives_name(d->collectives);
    return j;
  }
  std::map<std::string, NamedTensor> model_state_dict(const Model& model) override {
    return precision.state_dict(model);
  }
  TrainingState training_state(Model& model) override { return precision.training_state(model); }

  ReplicatedPrecision precision;  ///< the parameters' dtype, the gradients and the optimizer
};

}  // namespace ringzero
