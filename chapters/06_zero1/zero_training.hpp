// Chapter 06's lesson: training with ZeRO-1 (zero.hpp), optimizer state sharded over ranks.
//
// Provides: Zero1Training (the Zero1 engine, which owns this rank's optimizer shard), its Flags
// (the bucket flags, --explain-buckets; --collectives and the memory calculator from
// common/zero_lesson.hpp) and train_step(), one for every precision: the lesson is built over
// the element types --precision and --reduce-dtype pick (common/shard_precision.hpp).
// Leaves out: the buckets, shards and collectives (zero.hpp, shard.hpp, bucket_collectives.hpp).
#pragma once

#include <optional>
#include <string>

#include "chapters/06_zero1/zero.hpp"
#include "common/dist_eval.hpp"
#include "common/lesson.hpp"
#include "common/run.hpp"
#include "common/train.hpp"
#include "common/zero_lesson.hpp"

namespace ringzero {

/// Chapter 06's lesson object: the ZeRO-1 engine, which owns the parameters, the gradients and
/// this rank's optimizer shard, over element types T and R (Zero1).
template <class T = float, class R = T>
class Zero1Training : public Lesson {
 public:
  using Flags = ZeroBucketFlags;  // zero_options.hpp

  /// Plans buckets and shards, moves the model's parameters into the engine's buffers, builds this
  /// rank's optimizer shard.
  Zero1Training(SetUp& s, const Flags& flags)
      : comm(*s.comm),
        zero(*s.comm, s.model, s.config, with_tracer(flags.zero, s.tracer)),
        model_(s.model),
        flags_(flags) {}

  std::string banner() const override {
    return " | " + std::to_string(zero.buckets().size()) + " buckets | collectives " +
           collectives_name(flags_.zero.collectives);
  }
  std::string explanation() const override {
    return flags_.explain ? explain_buckets(zero.buckets(), model_, flags_.zero.bucket_cap_mb,
                                            flags_.zero.first_bucket_cap_mb, "reduce-scattered")
                          : "";
  }
  bool reset_ledger_peaks() const override { return true; }
  std::map<std::string, NamedTensor> model_state_dict(const Model&) override {
    return zero.model_state_dict();  // 16 bits: the fp32 master weights
  }
  void start_trace(Tracer& tracer) override { trace_layers(tracer, model_); }
  std::string ledger_formula(int64_t) const override { return zero.ledger_formula(); }
  TrafficTheory traffic_theory() const override {
    return zero.traffic_theory();  // reduce-scatter + all-gather per padded bucket
  }
  /// The gradients' reduce-scatter overlaps backward; the parameters' all-gather follows the
  /// optimizer step.
  CommSchedule comm_schedule() const override {
    const std::vector<int64_t> sizes = bucket_sizes(zero.buckets());  // in launch order
    return {Overlap::backward, {"ring_reduce_scatter"}, {sizes.begin(), sizes.end()}};
  }
  nlohmann::json summary_fields() const override {
    nlohmann::json fields =
        zero_summary_fields(1, flags_.zero.collectives, zero.model_states_bytes(),
                            zero.layout().padding_total, zero.traffic_theory());
    fields["buckets"] = zero.buckets().size();
    fields.update(zero.optimizer().summary());  // 16 bits: precision, loss scale, skips
    return fields;
  }
  std::optional<std::map<std::string, NamedTensor>> saved_optimizer_state() override {
    return zero.optimizer_state_dict();
  }
  TrainingState training_state(Model&) override { return zero.training_state(); }

  Communicator& comm;
  Zero1<T, R> zero;

 private:
  static ZeroOptions with_tracer(ZeroOptions o, Tracer& tracer) {
    o.tracer = &tracer;
    return o;
  }
  Model& model_;
  Flags flags_;
};

/// One optimizer step on the global batch: K micro-steps on this rank's share, the last one's
/// backward reduce-scattering bucket after bucket, each rank's step on its shard, and the
/// all-gather of the parameters. Returns the global batch's mean loss (on every rank).
/// Errors: a non-finite loss stops every rank; a parameter without gradient.
template <class T, class R>
double train_step(Zero1Training<T, R>& lesson, const Step& step) {
  Tracer::Span span(step.tracer, "step " + std::to_string(step.step), "step");
  Zero1<T, R>& zero = lesson.zero;
  const int64_t K = step.config.grad_accum_steps;
  zero.zero_grad();
  double loss_sum = 0;
  for (int64_t micro_step = 0; micro_step < K; ++micro_step) {
    Batch batch = step.micro_batch(micro_step);           // (B/(N K), in)
    zero.set_require_sync(micro_step == K - 1);  // only the last backward sends
    Tape tape;
    Var loss = forward_loss(tape, step.model, batch);  // mean over this micro-batch
    loss_sum += loss->value[0];
    tape.backward(loss, zero.optimizer().seed(K));  // grads += dloss/K; full buckets start
  }
  {
    Tracer::Span wait(step.tracer, "finalize_backward (wait for buckets)", "ddp");
    zero.finalize_backward();  // every bucket reduce-scattered: this rank's shard holds the mean
  }
  const double loss_value = global_mean(lesson.comm, loss_sum / K);  // equal shares
  zero.optimizer().check_first_loss(loss_value, step.step);          // fp16: forward overflow?
  // Every rank stops together; the error names the rank(s) whose loss is not finite.
  check_finite_loss(lesson.comm, loss_sum / K, loss_value, step.step);

  Tracer::Span opt(step.tracer, "optimizer step + all_gather", "optimizer");
  zero.step();  // each rank updates its shard (--clip-grad-norm first), then gathers every shard
  return loss_value;
}

}  // namespace ringzero
