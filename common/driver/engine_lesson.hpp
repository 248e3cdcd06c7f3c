// engine_lesson: the Lesson the shared driver derives from an engine's description, so that a
// chapter holds its engine and its train_step and nothing of the reporting.
//
// Provides: the derivations from an EngineDescription (engine_description.hpp), written once
// for every chapter (engine_banner, engine_comm_schedule, engine_summary_fields), and
// EngineLesson<Engine>, the Lesson over an engine (chapter 05's DDP, chapters 06-08's Zero1,
// Zero2, Zero3). The saved state (--save-final, --save-optimizer-state
// and a checkpoint's training state): derived for the ZeRO engines from their description in
// shard_state.hpp (ShardedEngine), DDP's from its ReplicatedPrecision (precision.hpp). The
// traffic text line of ZeRO-1, 2 and 3 and the ledger formula line of ZeRO-1 and 2: derived from
// the description, the optimizer and the chapter's bytes (zero_lesson.hpp, shard_precision.hpp).
// Leaves out: the chapter's theory (its exact model-state bytes and traffic bytes: the engine's
// own methods; DDP's and ZeRO-3's ledger lines, which they write) and the step (step.hpp).
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "common/comm/collectives.hpp"
#include "common/driver/bucket_tools.hpp"
#include "common/core/half.hpp"
#include "common/driver/engine_description.hpp"
#include "common/driver/lesson.hpp"
#include "common/precision/precision.hpp"
#include "common/precision/shard_precision.hpp"
#include "common/report/cost_model.hpp"
#include "common/report/trace.hpp"
#include "common/zero/shard_state.hpp"
#include "common/zero/zero_lesson.hpp"

namespace ringzero {

/// The start-up line's tail, e.g. " | 11 buckets | collectives ring" or
/// " | 3 layers | prefetch on | collectives ring".
inline std::string engine_banner(const EngineDescription& d) {
  std::string s = " | " + std::to_string(d.unit_sizes.size()) + " " + d.unit;
  if (d.prefetch) s += std::string(" | prefetch ") + (*d.prefetch ? "on" : "off");
  return s + " | collectives " + collectives_name(d.collectives);
}

/// The cost model's schedule (cost_model.hpp): DDP's all-reduces and ZeRO-1/2's
/// reduce-scatters run while backward goes on, bucket by bucket in launch order; ZeRO-3 with
/// prefetch overlaps forward and backward with its gathers, and without it overlaps nothing.
inline CommSchedule engine_comm_schedule(const EngineDescription& d) {
  const std::vector<double> sizes(d.unit_sizes.begin(), d.unit_sizes.end());
  if (d.zero_stage == 0) return {Overlap::backward, {}, sizes};
  if (d.zero_stage == 3)
    return {.overlap = d.prefetch.value_or(true) ? Overlap::forward_and_backward : Overlap::none,
            .sizes = sizes,
            .sharded_optimizer = true};
  return {.overlap = Overlap::backward,
          .overlapped_ops = {"ring_reduce_scatter"},
          .sizes = sizes,
          .max_in_flight = d.max_in_flight,
          .sharded_optimizer = true};
}

/// The summary record's fields of an engine: the collectives and the number of units under
/// their name; for ZeRO also zero_lesson.hpp's (stage, exact model-state bytes per rank,
/// padding, theory bytes), prefetch and the in-flight peak where the engine has them.
/// model_states_bytes: one entry per rank (ZeRO; unused for DDP).
inline nlohmann::json engine_summary_fields(const EngineDescription& d,
                                            const std::vector<int64_t>& model_states_bytes,
                                            const TrafficTheory& theory) {
  if (d.zero_stage == 0)
    return {{"collectives", collectives_name(d.collectives)}, {d.unit, d.unit_sizes.size()}};
  nlohmann::json fields =
      zero_summary_fields(d.zero_stage, d.collectives, model_states_bytes, d.padding, theory);
  fields[d.unit] = d.unit_sizes.size();
  if (d.prefetch) fields["prefetch"] = *d.prefetch;
  if (d.in_flight_peak_bytes) fields["in_flight_peak_bytes"] = *d.in_flight_peak_bytes;
  return fields;
}

/// The Lesson of a data-parallel engine: everything the driver asks is the engine's
/// description, its theory, or its state. Engine: DDP, or Zero1/Zero2/Zero3 over element
/// types; built from (Communicator&, Model&, const TrainConfig&, Options), Options with a
/// `Tracer* tracer`. Flags: has `options` (the engine's, set by the command line; the run's
/// tracer is added here) and `explain` (--explain-buckets/--explain-layers).
template <class Engine>
class EngineLesson : public Lesson {
  static_assert(
      ShardedEngine<Engine> ||
          std::is_same_v<std::remove_cvref_t<decltype(std::declval<Engine&>().optimizer())>,
                         ReplicatedPrecision>,
      "an engine either shards (ShardedEngine, shard_state.hpp) or holds a "
      "ReplicatedPrecision (DDP), so that its saved state is derived here");

 public:
  template <class Flags>
  EngineLesson(SetUp& s, const Flags& flags)
      : engine(*s.comm, s.model, s.config, traced(flags.options, s.tracer)),
        model_(s.model),
        options_(flags.options),
        explain_(flags.explain),
        grad_accum_steps_(s.config.grad_accum_steps) {}

  std::optional<EngineDescription> description() const override { return engine.describe(); }
  std::string banner() const override { return engine_banner(engine.describe()); }
  /// --explain-buckets (bucket_tools.hpp: DDP's all-reduced, ZeRO-1/2's reduce-scattered
  /// buckets) or --explain-layers (zero_lesson.hpp: ZeRO-3's layer shards), from the engine.
  std::string explanation() const override {
    if (!explain_) return "";
    const EngineDescription d = engine.describe();
    if constexpr (requires { engine.buckets(); })
      return explain_buckets(engine.buckets(), model_, options_.bucket_cap_mb,
                             options_.first_bucket_cap_mb,
                             d.zero_stage == 0 ? "all-reduced" : "reduce-scattered");
    else
      return explain_layer_shards(engine.layout().layers, d.units, d.world_size);
  }
  bool reset_ledger_peaks() const override { return engine.describe().reset_ledger_peaks; }
  /// --trace: each layer's forward and backward (inside the engine's own hooks: compute only)
  /// and the optimizer's steps; the collectives and the waits for them are the engine's
  /// CommQueue's.
  void start_trace(Tracer& tracer) override {
    trace_layers(tracer, model_);
    engine.optimizer().trace_into(&tracer);
  }
  /// ZeRO-3: every forward gathers, so every rank runs as many (common/driver/dist_eval.hpp).
  std::optional<EvalResult> evaluate(const Dataset& test) override {
    if (!engine.describe().collective_forward) return std::nullopt;  // the driver's default
    return evaluate_in_lockstep(engine.comm(), model_, test);
  }
  /// The engine's own (DDP's, ZeRO-3's), or derived from ZeRO-1's and ZeRO-2's description and
  /// exact model-state bytes (shard_precision.hpp's bucket_zero_ledger_formula).
  std::string ledger_formula(int64_t psi) const override {
    if constexpr (requires { engine.ledger_formula(); }) {
      return engine.ledger_formula();
    } else {
      const EngineDescription d = engine.describe();
      return bucket_zero_ledger_formula(d.zero_stage, d.padding, d.in_flight_peak_bytes.value_or(0),
                                        engine.optimizer(), psi, engine.model_states_bytes());
    }
  }
  /// The engine's bytes per rank (its theory); a ZeRO engine's text line derived from its
  /// description and the run's K (zero_lesson.hpp's zero_traffic_formula; DDP writes its own).
  TrafficTheory traffic_theory() const override {
    TrafficTheory theory = engine.traffic_theory();
    if constexpr (ShardedEngine<Engine>) {
      const ShardOptimizer& optimizer = engine.optimizer();
      theory.formula = zero_traffic_formula(
          engine.describe(), model_.num_parameters(), dtype_bytes(optimizer.reduce_dtype()),
          dtype_bytes(optimizer.dtype()), theory.bytes_sent[0], grad_accum_steps_);
    }
    return theory;
  }
  CommSchedule comm_schedule() const override { return engine_comm_schedule(engine.describe()); }
  nlohmann::json summary_fields() const override {
    std::vector<int64_t> model_states_bytes;  // DDP: every rank the same (the ledger formula)
    if constexpr (requires { engine.model_states_bytes(); })
      model_states_bytes = engine.model_states_bytes();
    nlohmann::json fields =
        engine_summary_fields(engine.describe(), model_states_bytes, traffic_theory());
    fields.update(engine.optimizer().summary());  // 16 bits: precision, loss scale, skips
    return fields;
  }
  std::map<std::string, NamedTensor> model_state_dict(const Model&) override {
    if constexpr (ShardedEngine<Engine>)
      return sharded_model_state_dict(engine, model_);  // collective: the shards gathered
    else
      return engine.optimizer().state_dict(model_);  // DDP: its ReplicatedPrecision's
  }
  std::optional<std::map<std::string, NamedTensor>> saved_optimizer_state() override {
    if constexpr (ShardedEngine<Engine>)
      return sharded_optimizer_state_dict(engine, model_);  // collective: gathered from the shards
    else
      return std::nullopt;  // DDP: every rank's optimizer holds it whole
  }
  TrainingState training_state(Model&) override {
    if constexpr (ShardedEngine<Engine>)
      return sharded_training_state(engine, model_);  // this rank's pieces (shard_state.hpp)
    else
      return engine.optimizer().training_state(model_);
  }

  Engine engine;

 private:
  static typename Engine::Options traced(typename Engine::Options options, Tracer& tracer) {
    options.tracer = &tracer;  // the engine's queue traces its collectives while --trace is on
    return options;
  }
  Model& model_;
  typename Engine::Options options_;  // the engine's, as the flags set them
  bool explain_;
  int64_t grad_accum_steps_;  // K: ZeRO-3's collectives run every micro-step
};

}  // namespace ringzero
