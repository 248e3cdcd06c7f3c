// Chapter 05's lesson: training with DDP (ddp.hpp), gradient buckets all-reduced during
// backward, and no_sync for gradient accumulation.
//
// Provides: DDPTraining (the replicated optimizer and the DDP wrapper), its Flags and
// train_step().
// Leaves out: the bucket plan (buckets.hpp) and the hooks and communication thread (ddp.hpp).
#pragma once

#include <optional>
#include <string>

#include "chapters/05_ddp_buckets/ddp.hpp"
#include "common/dist.hpp"
#include "common/dist_eval.hpp"
#include "common/lesson.hpp"
#include "common/metrics.hpp"
#include "common/run.hpp"
#include "common/train.hpp"

namespace ringzero {

/// Chapter 05's lesson object: every rank's optimizer (replicated state, as chapter 04) and
/// the DDP that all-reduces the gradients bucket by bucket during backward.
class DDPTraining : public Lesson {
 public:
  /// The chapter's flags: DDP's options and --explain-buckets.
  struct Flags : LessonOptions {
    DDP::Options ddp;
    bool explain = false;

    void add_flags(CommandLine& cli) override {
      add_collectives_flag(cli.app, ddp.collectives,
                           "ring (ours, chapter 04) | mpi (MPI_Allreduce)");
      add_bucket_flags(cli, ddp.bucket_cap_mb, ddp.first_bucket_cap_mb, ddp.find_unused_parameters);
      cli.app.add_flag("--explain-buckets", explain,
                       "print the bucket plan (buckets, parameters, elements, bytes)");
    }
  };

  /// Builds the optimizer, plans the buckets and checks every rank has the same plan.
  DDPTraining(SetUp& s, const Flags& flags)
      : comm(*s.comm),
        optimizer(s.config, parameter_sizes(s.model)),  // every rank: replicated optimizer state
        ddp(*s.comm, s.model, with_tracer(flags.ddp, s.tracer)),
        model_(s.model),
        explain_(flags.explain),
        states_(fp32_state_bytes(s.config.optimizer, s.config.momentum)) {}

  std::string banner() const override {
    return " | " + std::to_string(ddp.buckets().size()) + " buckets | collectives " +
           collectives_name(ddp.options().collectives);
  }
  std::string explanation() const override { return explain_ ? ddp.explain() : ""; }
  void start_trace(Tracer& tracer) override { trace_layers(tracer, model_); }
  std::string ledger_formula(int64_t psi) const override {
    return "formula (" + std::string(states_.name) +
           ", every rank): " + full_copy_formula_text(states_) + " = " +
           human_bytes(states_.per_param() * static_cast<double>(psi)) +
           "; comm_buffers: one chunk of the largest bucket";
  }
  TrafficTheory traffic_theory() const override {
    const int N = comm.world_size();
    const int64_t psi = model_.num_parameters();
    if (ddp.options().collectives == Collectives::mpi)  // MPI does not report its wire traffic
      return {std::vector<int64_t>(N, 4 * psi), std::vector<int64_t>(N, 4 * psi),
              "MPI_Allreduce: the counters show the Ψ·4 = " + human_bytes(4.0 * psi) +
                  " handed to MPI per step"};
    TrafficTheory theory = ring_all_reduce_traffic(bucket_sizes(ddp.buckets()), N);  // ch. 04's
    theory.formula += "; counted per bucket here: " + std::to_string(ddp.buckets().size()) +
                      " all-reduces instead of " + std::to_string(model_.parameters().size()) +
                      ", the same bytes";
    return theory;
  }
  /// Every bucket's all-reduce runs on the communication thread while backward goes on.
  CommSchedule comm_schedule() const override { return {Overlap::backward, {}}; }
  nlohmann::json summary_fields() const override {
    return {{"collectives", collectives_name(ddp.options().collectives)},
            {"buckets", ddp.buckets().size()}};
  }

  Communicator& comm;
  TrainingState training_state(Model& model) override {
    return replicated_state(model, &optimizer, "");
  }
  Optimizer optimizer;
  DDP ddp;

 private:
  static DDP::Options with_tracer(DDP::Options o, Tracer& tracer) {
    o.tracer = &tracer;
    return o;
  }
  Model& model_;
  bool explain_;
  StateBytes states_;  // bytes per parameter in fp32: p, g and --optimizer's state
};

/// One optimizer step on the global batch: K micro-steps on this rank's share, the last one's
/// backward all-reducing bucket after bucket, and the same optimizer step on every rank.
/// Returns the global batch's mean loss (on every rank). Errors: a non-finite loss stops every
/// rank; a parameter without gradient (DDP::finalize_backward).
inline double train_step(DDPTraining& lesson, const Step& step) {
  Tracer::Span span(step.tracer, "step " + std::to_string(step.step), "step");
  Model& model = step.model;
  const int64_t K = step.config.grad_accum_steps;
  model.zero_grad();
  double loss_sum = 0;
  for (int64_t micro_step = 0; micro_step < K; ++micro_step) {
    Batch batch = step.micro_batch(micro_step);  // (B/(N K), in)
    std::optional<DDP::NoSync> no_sync;          // only the last micro-step's backward sends
    if (micro_step < K - 1) no_sync.emplace(lesson.ddp);
    Tape tape;
    Var loss = forward_loss(tape, model, batch);  // mean over this micro-batch
    loss_sum += loss->value[0];
    tape.backward(loss, 1.0f / K);  // grads += dloss/K; full buckets start their all-reduce
  }
  {
    Tracer::Span wait(step.tracer, "finalize_backward (wait for buckets)", "ddp");
    lesson.ddp.finalize_backward();  // every bucket all-reduced and / N; MPI is ours again
  }
  const double loss_value = global_mean(lesson.comm, loss_sum / K);  // equal shares
  // Every rank stops together; the error names the rank(s) whose loss is not finite.
  check_finite_loss(lesson.comm, loss_sum / K, loss_value, step.step);

  Tracer::Span opt(step.tracer, "optimizer step", "optimizer");
  if (step.config.clip_grad_norm > 0)
    clip_grad_norm(model.grads_memory.span(), step.config.clip_grad_norm);
  lesson.optimizer.step(model.params_memory.span(), model.grads_memory.span());
  return loss_value;
}

}  // namespace ringzero
