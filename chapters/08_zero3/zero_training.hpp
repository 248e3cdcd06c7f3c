// Chapter 08's lesson: training with ZeRO-3 (zero3.hpp), optimizer state, gradients and
// parameters sharded over ranks.
//
// Provides: Zero3Training (the ZeRO object, which owns this rank's shards of everything), its
// Flags (--collectives, --no-prefetch, --explain-layers, the memory calculator) and
// train_step().
// Leaves out: the layer shards and their collectives (zero3.hpp, layer_shard.hpp).
#pragma once

#include <optional>
#include <string>

#include "chapters/08_zero3/zero3.hpp"
#include "common/dist.hpp"
#include "common/lesson.hpp"
#include "common/run.hpp"
#include "common/train.hpp"
#include "common/zero_memory.hpp"

namespace ringzero {

/// Chapter 08's lesson object: the ZeRO-3 engine, which owns this rank's shards of the
/// parameters, the gradients and the optimizer state, and gathers each layer when it is used.
class Zero3Training : public Lesson {
 public:
  /// The chapter's flags: ZeRO's options, --explain-layers and the memory calculator.
  struct Flags : LessonOptions {
    ZeRO::Options zero;
    bool explain = false, no_prefetch = false;
    MemoryCalculatorFlags calculator;

    void add_flags(CommandLine& cli) override {
      cli.app
          .add_option("--collectives", zero.collectives,
                      "ring (ours, chapter 04) | mpi (MPI_Reduce_scatter_block + MPI_Allgather)")
          ->check(CLI::IsMember({"ring", "mpi"}));
      cli.app.add_flag(
          "--no-prefetch", no_prefetch,
          "post each all-gather only when its layer needs it; wait for every collective");
      cli.app.add_flag("--find-unused-parameters", zero.find_unused_parameters,
                       "count a layer whose backward did not run as a zero gradient instead of "
                       "failing (chapters 05-07's flag)");
      cli.app.add_flag("--explain-layers", explain,
                       "print the layer plan (elements, padding, shard size per layer)");
      add_memory_calculator_flags(cli.app, calculator);
    }
    bool run_instead(Communicator*) override {
      if (calculator.enabled) print0(memory_calculator(calculator));
      return calculator.enabled;
    }
  };

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
           (flags_.no_prefetch ? "off" : "on") + " | collectives " + flags_.zero.collectives;
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
    return {flags_.no_prefetch ? Overlap::none : Overlap::forward_and_backward, {}};
  }
  nlohmann::json summary_fields() const override {
    return {{"zero_stage", 3},
            {"collectives", flags_.zero.collectives},
            {"layers", zero.layout().layers.size()},
            {"prefetch", !flags_.no_prefetch},
            {"model_states_exact_bytes", zero.model_states_bytes()},
            {"padding", comm.world_size() * zero.layout().shard_total - psi_},
            {"layers_in_flight_bytes", zero.layers_in_flight_bytes()},
            {"theory_bytes_sent_per_rank_per_step", traffic_theory().bytes_sent}};
  }
  std::map<std::string, NamedTensor> model_state_dict(const Model&) override {
    return zero.state_dict();  // collective: every layer gathered
  }
  std::optional<std::map<std::string, NamedTensor>> saved_optimizer_state() override {
    return zero.optimizer_state_dict();
  }
  TrainingState training_state(Model&) override { return zero.training_state(); }

  Communicator& comm;
  ZeRO zero;

 private:
  static ZeRO::Options options_of(const Flags& flags, Tracer& tracer) {
    ZeRO::Options o = flags.zero;
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
inline double train_step(Zero3Training& lesson, const Step& step) {
  Tracer::Span span(step.tracer, "step " + std::to_string(step.step), "step");
  ZeRO& zero = lesson.zero;
  const int64_t K = step.config.grad_accum_steps;
  zero.zero_grad();
  double loss_sum = 0;
  for (int64_t micro_step = 0; micro_step < K; ++micro_step) {
    Batch batch = step.micro_batch(micro_step);  // (B/(N K), in)
    Tape tape;
    Var loss = forward_loss(tape, step.model, batch);  // mean over this micro-batch; gathers
    loss_sum += loss->value[0];
    tape.backward(loss, 1.0f / K);  // gathers again; each layer's gradient shard += its mean
  }
  zero.finalize_backward();  // nothing in flight, no layer gathered: only the shards
  const double loss_value = global_mean(lesson.comm, loss_sum / K);  // equal shares
  // Every rank stops together; the error names the rank(s) whose loss is not finite.
  check_finite_loss(lesson.comm, loss_sum / K, loss_value, step.step);

  Tracer::Span opt(step.tracer, "optimizer step", "optimizer");
  if (step.config.clip_grad_norm > 0)
    zero.clip_grad_norm(step.config.clip_grad_norm);  // global norm over the shards
  zero.step();  // each rank updates its shard; the next forward gathers it
  return loss_value;
}

}  // namespace ringzero
