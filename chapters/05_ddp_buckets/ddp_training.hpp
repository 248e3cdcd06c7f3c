// Chapter 05's lesson: training with DDP (ddp.hpp), gradient buckets all-reduced during
// backward, and no_sync for gradient accumulation.
//
// Provides: DDPTraining (the replicated optimizer and the DDP wrapper), its Flags and
// train_step().
// Leaves out: the bucket plan (buckets.hpp), the hooks (readiness.hpp), the all-reduce
// (ddp.hpp), the precision (common/precision.hpp).
#pragma once

#include <string>

#include "chapters/05_ddp_buckets/ddp.hpp"
#include "common/dist.hpp"
#include "common/dist_eval.hpp"
#include "common/lesson.hpp"
#include "common/metrics.hpp"
#include "common/precision.hpp"
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
        precision(s.model, s.config, comm.world_size()),  // before the DDP's hooks
        ddp(*s.comm, s.model, with_tracer(flags.ddp, s.tracer), precision),
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
    if (!precision.is_fp32()) return ledger_formula_mixed(psi);
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
    TrafficTheory theory = ring_all_reduce_traffic(bucket_sizes(ddp.buckets()), N,
                                                   precision.grad_wire_bytes());  // ch. 04's
    theory.formula += "; counted per bucket here: " + std::to_string(ddp.buckets().size()) +
                      " all-reduces instead of " + std::to_string(model_.parameters().size()) +
                      ", the same bytes";
    return theory;
  }
  /// Every bucket's all-reduce runs on the communication thread while backward goes on, in
  /// launch order (the cost model replays it bucket by bucket).
  CommSchedule comm_schedule() const override {
    const std::vector<int64_t> sizes = bucket_sizes(ddp.buckets());
    return {Overlap::backward, {}, {sizes.begin(), sizes.end()}};
  }
  nlohmann::json summary_fields() const override {
    nlohmann::json j{{"collectives", collectives_name(ddp.options().collectives)},
                     {"buckets", ddp.buckets().size()}};
    j.update(precision.summary());
    return j;
  }
  bool reset_ledger_peaks() const override { return precision.reset_ledger_peaks(); }
  std::map<std::string, NamedTensor> model_state_dict(const Model& model) override {
    return precision.state_dict(model);
  }
  TrainingState training_state(Model& model) override {
    return precision.training_state(model);
  }

  Communicator& comm;
  ReplicatedPrecision precision;  ///< every rank's optimizer; first, before the DDP's hooks
  DDP ddp;

 private:
  std::string ledger_formula_mixed(int64_t psi) const {
    const bool half = precision.grad_wire_bytes() == 2;
    return "formula (" + std::string(dtype_name(precision.dtype())) +
           " + AdamW with fp32 master weights, every rank): 2Ψ + 2Ψ + 12Ψ = 16Ψ = " +
           human_bytes(16.0 * psi) + "; comm_buffers: " +
           (half ? "one 16-bit chunk of the largest bucket"
                 : "the gradient widened to fp32, 4Ψ, and one fp32 chunk of the largest "
                   "bucket") +
           "; activations: one layer's fp32 working copy and gradient scratch";
  }
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
  lesson.precision.zero_grad();
  double loss_sum = 0;
  for (int64_t micro_step = 0; micro_step < K; ++micro_step) {
    Batch batch = step.micro_batch(micro_step);  // (B/(N K), in)
    lesson.ddp.set_require_sync(micro_step == K - 1);  // only the last backward sends
    Tape tape;
    Var loss = forward_loss(tape, model, batch);  // mean over this micro-batch
    loss_sum += loss->value[0];
    tape.backward(loss, lesson.precision.seed(K));  // grads += dloss/K; full buckets start
  }
  {
    Tracer::Span wait(step.tracer, "finalize_backward (wait for buckets)", "ddp");
    lesson.ddp.finalize_backward();  // every bucket all-reduced, the mean; MPI is ours again
  }
  const double loss_value = global_mean(lesson.comm, loss_sum / K);  // equal shares
  lesson.precision.check_first_loss(loss_value, step.step);  // fp16: the forward overflowed?
  // Every rank stops together; the error names the rank(s) whose loss is not finite.
  check_finite_loss(lesson.comm, loss_sum / K, loss_value, step.step);

  Tracer::Span opt(step.tracer, "optimizer step", "optimizer");
  lesson.precision.step(&lesson.comm);  // the same step everywhere (--clip-grad-norm first)
  return loss_value;
}

}  // namespace ringzero
