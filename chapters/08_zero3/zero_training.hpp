// Chapter 08's lesson: training with ZeRO-3 (zero3.hpp), optimizer state, gradients and
// parameters sharded over ranks.
//
// Provides: Zero3Training (the Zero3 engine, which owns this rank's shards of everything), its
// Flags (--no-prefetch, --explain-layers; --collectives and the memory calculator from
// common/zero_lesson.hpp) and train_step(), one for every precision: the lesson is built over
// the element types --precision and --reduce-dtype pick (common/shard_precision.hpp).
// Leaves out: the layer shards and their collectives (zero3.hpp, layer_shard.hpp).
#pragma once

#include <optional>
#include <string>

#include "chapters/08_zero3/zero3.hpp"
#include "common/dist_eval.hpp"
#include "common/lesson.hpp"
#include "common/run.hpp"
#include "common/train.hpp"
#include "common/zero_lesson.hpp"

namespace ringzero {

/// The chapter's flags: the engine's options, --no-prefetch, --explain-layers, and ZeroFlags'
/// (--collectives, the memory calculator).
struct Zero3Flags : ZeroFlags {
  Zero3Options zero;
  bool explain = false, no_prefetch = false;

  void add_flags(CommandLine& cli) override {
    add_zero_flags(cli, zero.collectives);
    cli.app.add_flag(
        "--no-prefetch", no_prefetch,
        "post each all-gather only when its layer needs it; wait for every collective");
    cli.app.add_flag("--find-unused-parameters", zero.find_unused_parameters,
                     "count a layer whose backward did not run as a zero gradient instead of "
                     "failing (chapters 05-07's flag)");
    cli.app.add_flag("--explain-layers", explain,
                     "print the layer plan (elements, padding, shard size per layer)");
  }
};

/// Chapter 08's lesson object: the ZeRO-3 engine, which owns this rank's shards of the
/// parameters, the gradients and the optimizer state, and gathers each layer when it is used;
/// over element types T and R (Zero3).
template <class T = float, class R = T>
class Zero3Training : public Lesson {
 public:
  using Flags = Zero3Flags;

  /// Plans the layer shards, moves the model's parameters into this rank's shards (the model's
  /// buffers go), builds this rank's optimizer shards.
  Zero3Training(SetUp& s, const Flags& flags)
      : comm(*s.comm),
        zero(*s.comm, s.model, s.config, options_of(flags, s.tracer)),
        flags_(flags),
        psi_(s.model.num_parameters()),
        grad_accum_steps_(s.config.grad_accum_steps) {}

  std::string banner() const override {
    return " | " + std::to_string(zero.layout().layers.size()) + " layers | prefetch " +
           (flags_.no_prefetch ? "off" : "on") + " | collectives " +
           collectives_name(flags_.zero.collectives);
  }
  std::string explanation() const override {
    return flags_.explain ? explain_layer_shards(zero.layout(), comm.world_size()) : "";
  }
  bool reset_ledger_peaks() const override { return true; }
  std::optional<EvalResult> evaluate(const Dataset& test) override {
    return zero.evaluate(test);  // every rank runs as many forwards: each gathers
  }
  std::string ledger_formula(int64_t) const override { return zero.ledger_formula(); }
  TrafficTheory traffic_theory() const override {
    return zero.traffic_theory(grad_accum_steps_);  // 2 all-gathers + 1 reduce-scatter per layer
  }
  /// Prefetch: the next layer's all-gather (and the previous one's reduce-scatter) while this
  /// layer computes, forward and backward; without it, every collective is waited for.
  CommSchedule comm_schedule() const override {
    std::vector<double> sizes;  // per layer, in forward order (the cost model replays them)
    for (const LayerShard& s : zero.layout().layers)
      sizes.push_back(static_cast<double>(s.padded_size));
    return {flags_.no_prefetch ? Overlap::none : Overlap::forward_and_backward, {}, sizes};
  }
  nlohmann::json summary_fields() const override {
    nlohmann::json fields =
        zero_summary_fields(3, flags_.zero.collectives, zero.model_states_bytes(),
                            comm.world_size() * zero.layout().shard_total - psi_, traffic_theory());
    fields["layers"] = zero.layout().layers.size();
    fields["prefetch"] = !flags_.no_prefetch;
    fields["in_flight_peak_bytes"] = zero.in_flight_peak_bytes();
    fields.update(zero.optimizer().summary());  // 16 bits: precision, loss scale, skips
    return fields;
  }
  std::map<std::string, NamedTensor> model_state_dict(const Model&) override {
    return zero.model_state_dict();  // collective: every layer gathered
  }
  std::optional<std::map<std::string, NamedTensor>> saved_optimizer_state() override {
    return zero.optimizer_state_dict();
  }
  TrainingState training_state(Model&) override { return zero.training_state(); }

  Communicator& comm;
  Zero3<T, R> zero;

 private:
  static Zero3Options options_of(const Flags& flags, Tracer& tracer) {
    Zero3Options o = flags.zero;
    o.tracer = &tracer;
    o.prefetch = !flags.no_prefetch;
    return o;
  }
  Flags flags_;
  int64_t psi_, grad_accum_steps_;
};

/// One optimizer step on the global batch: K micro-steps on this rank's share, each gathering
/// every layer twice and reduce-scattering its gradient, then each rank's step on its shard.
/// Returns the global batch's mean loss (on every rank). Errors: a non-finite loss stops every
/// rank; ranks whose collectives differ (the desync check).
template <class T, class R>
double train_step(Zero3Training<T, R>& lesson, const Step& step) {
  Tracer::Span span(step.tracer, "step " + std::to_string(step.step), "step");
  Zero3<T, R>& zero = lesson.zero;
  const int64_t K = step.config.grad_accum_steps;
  zero.zero_grad();
  double loss_sum = 0;
  for (int64_t micro_step = 0; micro_step < K; ++micro_step) {
    Batch batch = step.micro_batch(micro_step);  // (B/(N K), in)
    Tape tape;
    Var loss = forward_loss(tape, step.model, batch);  // mean over this micro-batch; gathers
    loss_sum += loss->value[0];
    tape.backward(loss, zero.optimizer().seed(K));  // gathers again; each gradient shard += mean
  }
  zero.finalize_backward();  // nothing in flight, no layer gathered: only the shards
  const double loss_value = global_mean(lesson.comm, loss_sum / K);  // equal shares
  zero.optimizer().check_first_loss(loss_value, step.step);          // fp16: forward overflow?
  // Every rank stops together; the error names the rank(s) whose loss is not finite.
  check_finite_loss(lesson.comm, loss_sum / K, loss_value, step.step);

  Tracer::Span opt(step.tracer, "optimizer step", "optimizer");
  zero.step();  // each rank updates its shard (--clip-grad-norm first); the next forward gathers
  return loss_value;
}

}  // namespace ringzero
