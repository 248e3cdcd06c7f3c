// lesson: what a chapter's lesson object (its optimizer, central reducer, ring, DDP or ZeRO)
// tells the shared training driver (run.hpp).
//
// Provides: CommandLine (the CLI11 app plus the flags the cross-rank check leaves to others),
// SetUp (what a lesson object is built from) and Lesson, the interface whose defaults describe
// one process with a replicated model.
// Leaves out: what one step reads (Step, common/core/step.hpp) and the training step itself:
// every chapter writes it in its step.hpp, chapters 01-02 as train_step(Precision&, const Step&)
// over their lesson object's precision, chapters 03-04 as train_step(TheirLesson&, const Step&),
// chapters 05-08 as train_step(Engine&, const Step&)
// over the engine EngineLesson<Engine> holds (engine_lesson.hpp); tests call that same function.
// The driver records each call as the trace's "step N" span (run.cpp).
#pragma once

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "common/checks/finite_check.hpp"
#include "common/core/check.hpp"
#include "common/core/step.hpp"
#include "common/driver/config.hpp"
#include "common/driver/dist_eval.hpp"
#include "common/driver/engine_description.hpp"
#include "common/driver/train.hpp"
#include "common/io/checkpoint.hpp"
#include "common/io/safetensors.hpp"
#include "common/report/cost_model.hpp"
#include "common/report/dist.hpp"
#include "common/report/trace.hpp"
#include "common/zero/zero_memory.hpp"

namespace ringzero {

/// The command line of a run. The shared flags (config.hpp and run.hpp), the lesson's options
/// and every extension register on `app`.
struct CommandLine {
  CLI::App app;
  /// Flags the start-up check that every rank parsed the same flags skips, because a later
  /// check reports them better: --seed and --init-from by the parameter check
  /// (broadcast_and_verify_parameters; with --init-from the driver compares --seed as a flag
  /// after all: seed_checked_elsewhere, data_check.hpp), --data-dir by the data check
  /// (verify_same_data), the bucket caps by the bucket-plan check.
  std::vector<std::string> checked_elsewhere{"seed", "init-from", "data-dir"};
};

/// What a lesson object is built from, after the model exists and (distributed) every rank
/// verified it holds rank 0's initial parameters.
struct SetUp {
  Communicator* comm;  ///< null in the single-process chapters 01-02
  Model& model;
  const TrainConfig& config;
  Tracer& tracer;
};

/// The interface of a chapter's lesson object, as the shared driver (Run) sees it. Every
/// member has a default fit for one process with a replicated model; a chapter overrides what
/// its idea changes (the banner, the ledger formula, the traffic, where the state lives).
class Lesson {
 public:
  virtual ~Lesson() = default;
  /// Appended to the start-up line, e.g. " | 11 buckets | collectives ring".
  virtual std::string banner() const { return ""; }
  /// Printed after set-up when the chapter's --explain-* flag asks for it; "" prints nothing.
  virtual std::string explanation() const { return ""; }
  /// true: the ledger's peaks restart once the lesson object exists. ZeRO moves the parameters
  /// into its own buffers, and the moment they existed twice is set-up, not training.
  virtual bool reset_ledger_peaks() const { return false; }
  /// After set-up, when --trace is on: what the lesson adds to the trace (05-08: each layer's
  /// forward and backward, trace_layers, and the optimizer's steps; engine_lesson.hpp).
  virtual void start_trace(Tracer&) {}
  /// The test-set evaluation after an epoch, or nullopt for the driver's default
  /// (evaluate_distributed, or evaluate() on one process). Every rank returns the same numbers.
  virtual std::optional<EvalResult> evaluate(const Dataset&) { return std::nullopt; }
  /// The memory formula printed under the ledger table; Ψ is the number of parameters.
  virtual std::string ledger_formula(int64_t psi) const = 0;
  /// What each rank should move per optimizer step (the traffic table); {} on one process.
  virtual TrafficTheory traffic_theory() const { return {}; }
  /// What the step's communication overlaps, for the cost model (cost_model.hpp): none, by
  /// default (communicate, then compute).
  virtual CommSchedule comm_schedule() const { return {}; }
  /// What the lesson's data-parallel engine is, as data (chapters 03-04: their reduction, for
  /// the GPU planner and ReplicatedLesson's banner; 05-08: EngineLesson); nullopt in 01-02.
  virtual std::optional<EngineDescription> description() const { return std::nullopt; }
  /// The chapter's own fields of the summary record ("collectives", "buckets", "zero_stage"...).
  virtual nlohmann::json summary_fields() const { return nlohmann::json::object(); }
  /// The full model's parameters for --save-final, on every rank; collective where the
  /// parameters are sharded (ZeRO-3 gathers them).
  virtual std::map<std::string, NamedTensor> model_state_dict(const Model& model) {
    return state_dict(model);
  }
  /// AdamW's state, whole and unpadded ("<param>.exp_avg", ".exp_avg_sq", ".step"), on every
  /// rank; collective where it is sharded. nullopt where the lesson does not expose it.
  virtual std::optional<std::map<std::string, NamedTensor>> saved_optimizer_state() {
    return std::nullopt;
  }
  /// This rank's share of the training state, for checkpoints (common/io/checkpoint.hpp): views of
  /// the parameters and optimizer state it holds, placed in the model's flat layout. Every
  /// lesson with an optimizer overrides it; the default refuses, so no checkpoint can silently
  /// miss a lesson's optimizer state.
  virtual TrainingState training_state(Model& model) {
    (void)model;
    RZ_CHECK(false,
             "this chapter does not expose its training state: checkpoints (--checkpoint-dir, "
             "--resume) are not available in it");
    return {};
  }
};

}  // namespace ringzero
