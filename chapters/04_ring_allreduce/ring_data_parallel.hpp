// Chapter 04's lesson: data parallel where every rank all-reduces the gradients (ring.hpp) and
// steps its own, identical optimizer.
//
// Provides: RingDataParallel (the replicated optimizer and the ring's receive buffer), its
// Flags (--collectives, --bench-allreduce), all_reduce_gradients() and train_step().
// In 16 bits (--precision bf16|fp16, common/mixed_precision.hpp): the same all-reduces on the
// 16-bit gradients with ring.hpp's 16-bit ring (Ψ·2 bytes on the wire), pre-divided by N in the
// backward seed, and every rank holds the fp32 master weights (train_step_mixed below).
// Leaves out: the ring itself (ring.hpp), overlap with backward (chapter 05).
#pragma once

#include <algorithm>
#include <span>
#include <string>

#include "chapters/04_ring_allreduce/bench_allreduce.hpp"
#include "chapters/04_ring_allreduce/ring.hpp"
#include "common/collectives.hpp"
#include "common/comm.hpp"
#include "common/dist.hpp"
#include "common/dist_eval.hpp"
#include "common/lesson.hpp"
#include "common/metrics.hpp"
#include "common/mixed_precision.hpp"
#include "common/run.hpp"
#include "common/train.hpp"

namespace ringzero {

/// Sum over ranks of each parameter's gradient, then / N: the gradient of the global-batch
/// mean. One all-reduce per parameter, in registration order, as PyTorch's first DDP prototype
/// (one all-reduce per parameter after backward) does. `scratch`: at least one ring chunk of
/// the largest parameter.
inline void all_reduce_gradients(Communicator& comm, Model& model, bool ring,
                                 std::span<float> scratch) {
  for (size_t p = 0; p < model.parameters().size(); ++p) {
    std::span<float> grad =
        model.grads_memory.span().subspan(model.offsets()[p], model.parameters()[p]->numel());
    if (ring)
      ring_all_reduce(comm, grad, scratch);
    else
      comm.all_reduce(grad);  // MPI_Allreduce: the library's algorithm
    for (float& g : grad) g /= comm.world_size();
  }
}

/// all_reduce_gradients in 16 bits: the same per-parameter all-reduces on gradients backward
/// already divided by N (seed loss_scale/(N·K)), so nothing is divided after them. `grads`:
/// the 16-bit gradients (HalfStorage::grads16), summed by the 16-bit ring (MPI has no bf16
/// sum, so `ring` must be true), or their fp32 copy (--reduce-dtype fp32), summed by the fp32
/// ring or MPI_Allreduce. `scratch`: one ring chunk of the largest parameter.
template <class T>  // uint16_t (bf16/fp16 bits) or float
void all_reduce_predivided(Communicator& comm, const Model& model, bool ring, Dtype dtype,
                           std::span<T> grads, std::span<T> scratch) {
  for (size_t p = 0; p < model.parameters().size(); ++p) {
    std::span<T> grad = grads.subspan(model.offsets()[p], model.parameters()[p]->numel());
    if constexpr (std::is_same_v<T, uint16_t>)
      ring_all_reduce(comm, grad, dtype, scratch);  // 16-bit ring: one rounding per hop
    else if (ring)
      ring_all_reduce(comm, grad, scratch);
    else
      comm.all_reduce(grad);
  }
}

/// Chapter 04's lesson object: every rank's optimizer (replicated state) and the ring's buffer.
class RingDataParallel : public Lesson {
 public:
  struct Flags : LessonOptions {
    Collectives collectives = Collectives::ring;  ///< ring (ours) | mpi (MPI_Allreduce)
    bool bench = false;  ///< --bench-allreduce: the table instead of training

    void add_flags(CommandLine& cli) override {
      add_collectives_flag(cli.app, collectives, "ring (ours, ring.hpp) | mpi (MPI_Allreduce)");
      cli.app.add_flag("--bench-allreduce", bench,
                       "print a bus-bandwidth table, ours vs MPI_Allreduce, 4 KiB to 64 MiB");
    }
    bool run_instead(Communicator* comm) override {
      if (bench) bench_allreduce(*comm);
      return bench;
    }
  };

  RingDataParallel(SetUp& s, const Flags& flags)
      : comm(*s.comm),
        mixed(make_mixed_precision(s.model, s.config)),  // 16 bits: master weights every rank
        optimizer(s.config, mixed ? std::vector<int64_t>{} : parameter_sizes(s.model)),
        ring(flags.collectives == Collectives::ring),
        sizes_(parameter_sizes(s.model)),
        psi_(s.model.num_parameters()),
        states_(fp32_state_bytes(s.config.optimizer, s.config.momentum)) {
    const int64_t largest = *std::max_element(sizes_.begin(), sizes_.end());
    const int64_t chunk = ring_chunk(largest, comm.world_size(), 0).size;
    if (!mixed || mixed->reduce_dtype() == Dtype::fp32)
      scratch = Buffer(chunk, MemTag::comm_buffers);  // (ceil(Ψ_p / N)) one incoming chunk
    else
      scratch16 = Buffer16(chunk, MemTag::comm_buffers);
    if (mixed && mixed->reduce_dtype() == Dtype::fp32)
      grads32 = Buffer(psi_, MemTag::comm_buffers);  // (Ψ) the 16-bit gradients, widened
    RZ_CHECK(!mixed || ring || mixed->reduce_dtype() == Dtype::fp32,
             "--collectives mpi with --reduce-dtype "
                 << dtype_name(mixed->reduce_dtype())
                 << " (--reduce-dtype defaults to the --precision): MPI has no "
                 << dtype_name(mixed->reduce_dtype())
                 << " sum; use --reduce-dtype fp32 (widen and sum in fp32) or --collectives ring");
  }
  std::string banner() const override {
    return std::string(" | collectives ") + (ring ? "ring" : "mpi");
  }
  std::string ledger_formula(int64_t psi) const override {
    if (mixed) return ledger_formula_mixed(psi);
    return "formula (" + std::string(states_.name) +
           ", every rank): " + full_copy_formula_text(states_) + " = " +
           human_bytes(states_.per_param() * static_cast<double>(psi)) +
           "; comm_buffers: one chunk of the largest parameter";
  }
  TrafficTheory traffic_theory() const override {
    const int N = comm.world_size();
    if (!ring)  // MPI does not report its wire traffic, only what we hand it
      return {std::vector<int64_t>(N, 4 * psi_), std::vector<int64_t>(N, 4 * psi_),
              "MPI_Allreduce: the counters show the Ψ·4 = " + human_bytes(4.0 * psi_) +
                  " handed to MPI per step"};
    const bool half = mixed && mixed->reduce_dtype() != Dtype::fp32;
    return ring_all_reduce_traffic(sizes_, N, half ? 2 : 4);
  }
  // In 16 bits the fp32 model existed during set-up only; the peaks start after it.
  bool reset_ledger_peaks() const override { return mixed != nullptr; }
  nlohmann::json summary_fields() const override {
    nlohmann::json j{{"collectives", ring ? "ring" : "mpi"}};
    if (mixed) j.update(mixed->summary());
    return j;
  }
  std::map<std::string, NamedTensor> model_state_dict(const Model& model) override {
    return mixed ? mixed->master_state_dict(model) : state_dict(model);
  }

  Communicator& comm;
  TrainingState training_state(Model& model) override {
    return replicated_state(model, &optimizer, "");
  }
  std::unique_ptr<MixedPrecision> mixed;  ///< null in fp32; first, before any gradient hook
  Optimizer optimizer;                    ///< fp32 (no state in 16 bits: `mixed` steps)
  bool ring;                              ///< our ring (true) or MPI_Allreduce
  Buffer scratch;      ///< one incoming ring chunk of the largest parameter (fp32 sums)
  Buffer16 scratch16;  ///< the same chunk in 16 bits (--reduce-dtype bf16|fp16)
  Buffer grads32;      ///< --reduce-dtype fp32: (Ψ) the 16-bit gradients widened to fp32

 private:
  std::string ledger_formula_mixed(int64_t psi) const {
    const bool half = mixed->reduce_dtype() != Dtype::fp32;
    return "formula (" + std::string(dtype_name(mixed->dtype())) +
           " + AdamW with fp32 master weights, every rank): 2Ψ + 2Ψ + 12Ψ = 16Ψ = " +
           human_bytes(16.0 * psi) + "; comm_buffers: " +
           (half ? "one 16-bit chunk of the largest parameter"
                 : "the gradient widened to fp32, 4Ψ, and one fp32 chunk of the largest "
                   "parameter") +
           "; activations: one layer's fp32 working copy and gradient scratch";
  }
  std::vector<int64_t> sizes_;
  int64_t psi_;
  StateBytes states_;  // bytes per parameter in fp32: p, g and --optimizer's state
};

/// train_step in 16 bits: the same all-reduces on the 16-bit gradients (or on fp32 copies of
/// them, --reduce-dtype fp32) and the same step on every rank's master weights. Backward's
/// seed is loss_scale/(N·K): each rank's gradient is already divided by N (pre-divided, as
/// PyTorch's DDP divides before its all-reduce), so the 16-bit sum is the mean, nothing is
/// divided after it, and the sum cannot overflow by a factor N.
inline double train_step_mixed(RingDataParallel& dp, const Step& step) {
  Communicator& comm = dp.comm;
  MixedPrecision& mixed = *dp.mixed;
  HalfStorage& half = mixed.storage();
  const int64_t K = step.config.grad_accum_steps;
  const int N = comm.world_size();
  mixed.zero_grad();
  double loss_sum = 0;
  for (int64_t micro_step = 0; micro_step < K; ++micro_step) {
    Batch batch = step.micro_batch(micro_step);  // (B/(N K), in)
    Tape tape;
    Var loss = forward_loss(tape, step.model, batch);  // mean over this micro-batch
    loss_sum += loss->value[0];
    tape.backward(loss, 1.0f / static_cast<float>(N * K) * mixed.loss_scale());  // pre-divided
  }
  const double loss_value = global_mean(comm, loss_sum / K);  // equal shares: mean of means
  mixed.check_first_loss(loss_value, step.step);              // fp16: the forward overflowed?
  check_finite_loss(comm, loss_sum / K, loss_value, step.step);

  std::span<const float> grads32;  // empty: the optimizer reads the 16-bit sum
  if (dp.grads32.size() > 0) {     // --reduce-dtype fp32: Ψ·4 on the wire, summed in fp32
    convert_to_float(mixed.dtype(), half.grads16.span(), dp.grads32.span());
    all_reduce_predivided(comm, step.model, dp.ring, mixed.dtype(), dp.grads32.span(),
                          dp.scratch.span());
    grads32 = dp.grads32.span();
  } else {  // Ψ·2 on the wire, one 16-bit rounding per hop
    all_reduce_predivided(comm, step.model, dp.ring, mixed.dtype(), half.grads16.span(),
                          dp.scratch16.span());
  }
  // The same sum on every rank, so the same step (fp16: the overflow verdict of every rank).
  mixed.step(step.config.clip_grad_norm, &comm, grads32);
  return loss_value;
}

/// One optimizer step on the global batch: K micro-steps on this rank's share, the all-reduce,
/// and the same optimizer step on every rank. Returns the global batch's mean loss (on every
/// rank). Errors: a non-finite loss stops every rank.
inline double train_step(RingDataParallel& dp, const Step& step) {
  if (dp.mixed) return train_step_mixed(dp, step);
  Communicator& comm = dp.comm;
  Model& model = step.model;
  const int64_t K = step.config.grad_accum_steps;
  model.zero_grad();
  double loss_sum = 0;
  for (int64_t micro_step = 0; micro_step < K; ++micro_step) {
    Batch batch = step.micro_batch(micro_step);  // (B/(N K), in)
    Tape tape;
    Var loss = forward_loss(tape, model, batch);  // mean over this micro-batch
    loss_sum += loss->value[0];
    tape.backward(loss, 1.0f / K);  // grads += dloss/K: the mean over this rank's share
  }
  const double loss_value = global_mean(comm, loss_sum / K);  // equal shares: mean of means
  // Every rank stops together; the error names the rank(s) whose loss is not finite.
  check_finite_loss(comm, loss_sum / K, loss_value, step.step);

  all_reduce_gradients(comm, model, dp.ring, dp.scratch.span());  // identical grads, bit for bit
  if (step.config.clip_grad_norm > 0)
    clip_grad_norm(model.grads_memory.span(), step.config.clip_grad_norm);
  dp.optimizer.step(model.params_memory.span(), model.grads_memory.span());  // same everywhere
  return loss_value;
}

}  // namespace ringzero
