// Chapter 07's lesson: training with ZeRO-2 (zero.hpp), optimizer state and gradients sharded over
// ranks.
//
// Provides: Zero2Training (the Zero2 engine, which owns this rank's optimizer shard), its Flags
// (the bucket flags, --explain-buckets; --collectives and the memory calculator from
// common/zero_lesson.hpp) and train_step(), in fp32 or (--precision bf16|fp16) in 16 bits.
// Leaves out: the buckets, shards and collectives (zero.hpp, shard.hpp, bucket_collectives.hpp).
#pragma once

#include <optional>
#include <string>

#include "chapters/07_zero2/zero.hpp"
#include "common/dist_eval.hpp"
#include "common/lesson.hpp"
#include "common/run.hpp"
#include "common/train.hpp"
#include "common/zero_lesson.hpp"

namespace ringzero {

/// Chapter 07's lesson object: the ZeRO-2 engine, which owns the parameters, this rank's
/// gradient shard (and the buckets in flight) and this rank's optimizer shard.
class Zero2Training : public Lesson {
 public:
  /// The chapter's flags: the engine's options, --explain-buckets, and ZeroFlags' (--collectives,
  /// the memory calculator).
  struct Flags : ZeroFlags {
    Zero2::Options zero;
    bool explain = false;

    void add_flags(CommandLine& cli) override {
      add_zero_flags(cli, zero.collectives);
      add_bucket_flags(cli, zero.bucket_cap_mb, zero.first_bucket_cap_mb,
                       zero.find_unused_parameters);
      cli.app.add_flag("--explain-buckets", explain,
                       "print the bucket plan (buckets, parameters, elements, bytes)");
    }
  };

  /// Plans buckets and shards, moves the model's parameters into the engine's buffers, builds this
  /// rank's optimizer shard.
  Zero2Training(SetUp& s, const Flags& flags)
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
  std::map<std::string, NamedTensor> model_state_dict(const Model& model) override {
    return zero.mixed() ? zero.master_state_dict() : state_dict(model);  // 16 bits: the masters
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
    return {Overlap::backward, {"ring_reduce_scatter"}, {sizes.begin(), sizes.end()},
            2};  // at most two buckets exist at once (zero.hpp)
  }
  nlohmann::json summary_fields() const override {
    nlohmann::json fields =
        zero_summary_fields(2, flags_.zero.collectives, zero.model_states_bytes(),
                            zero.layout().padding_total, zero.traffic_theory());
    fields["buckets"] = zero.buckets().size();
    fields["in_flight_peak_bytes"] = zero.in_flight_peak_bytes();
    if (zero.mixed()) fields.update(zero.mixed()->summary());  // precision, loss scale, skips
    return fields;
  }
  std::optional<std::map<std::string, NamedTensor>> saved_optimizer_state() override {
    return zero.optimizer_state_dict();
  }
  TrainingState training_state(Model&) override { return zero.training_state(); }

  Communicator& comm;
  Zero2 zero;

 private:
  static Zero2::Options with_tracer(Zero2::Options o, Tracer& tracer) {
    o.tracer = &tracer;
    return o;
  }
  Model& model_;
  Flags flags_;
};

/// One optimizer step on the global batch: K micro-steps on this rank's share, the last one's
/// backward reduce-scattering bucket after bucket (and freeing it), each rank's step on its shard,
/// and the all-gather of the parameters. Returns the global batch's mean loss (on every rank).
/// Errors: a non-finite loss stops every rank; a parameter without gradient.
inline double train_step(Zero2Training& lesson, const Step& step) {
  Tracer::Span span(step.tracer, "step " + std::to_string(step.step), "step");
  Zero2& zero = lesson.zero;
  const int64_t K = step.config.grad_accum_steps;
  // 16 bits: loss_scale/(N·K), pre-divided by N, so the 16-bit reduce-scatter sums the mean.
  const float seed = zero.mixed() ? zero.mixed()->backward_seed(lesson.comm.world_size(), K)
                                  : 1.0f / static_cast<float>(K);
  zero.zero_grad();
  double loss_sum = 0;
  for (int64_t micro_step = 0; micro_step < K; ++micro_step) {
    Batch batch = step.micro_batch(micro_step);  // (B/(N K), in)
    std::optional<Zero2::NoSync> no_sync;        // only the last micro-step's backward sends
    if (micro_step < K - 1) no_sync.emplace(zero);
    Tape tape;
    Var loss = forward_loss(tape, step.model, batch);  // mean over this micro-batch
    loss_sum += loss->value[0];
    tape.backward(loss, seed);  // grads += dloss/K; full buckets start their reduce-scatter
  }
  {
    Tracer::Span wait(step.tracer, "finalize_backward (wait for buckets)", "ddp");
    zero.finalize_backward();  // every bucket reduce-scattered: this rank's shard holds the mean
  }
  const double loss_value = global_mean(lesson.comm, loss_sum / K);         // equal shares
  if (zero.mixed()) zero.mixed()->check_first_loss(loss_value, step.step);  // fp16 overflow
  // Every rank stops together; the error names the rank(s) whose loss is not finite.
  check_finite_loss(lesson.comm, loss_sum / K, loss_value, step.step);

  Tracer::Span opt(step.tracer, "optimizer step + all_gather", "optimizer");
  if (zero.mixed()) {  // 16 bits: overflow check (fp16), clipping, masters, 16-bit all-gather
    zero.step_16_bits(step.config.clip_grad_norm);
    return loss_value;
  }
  if (step.config.clip_grad_norm > 0)
    zero.clip_grad_norm(step.config.clip_grad_norm);  // global norm over the shards
  zero.step();  // each rank updates its shard, then every rank gathers every shard
  return loss_value;
}

}  // namespace ringzero
