// Central reducer: the first data-parallel step, and the bottleneck the ring removes.
//
// Every rank computes gradients on its own share of the global batch. Then:
//   1. reduce_to_rank0:      ranks 1..N−1 send their gradients (Ψ floats each) to rank 0,
//                            which adds them to its own in rank order: ((g0 + g1) + g2) + ...
//   2. rank 0 alone averages (÷ N) and steps the optimizer: only rank 0 holds optimizer state;
//   3. broadcast_from_rank0: rank 0 sends the new parameters (Ψ floats) to ranks 1..N−1.
//
//        rank 1 ──g1──▶ ┌────────┐ ──θ──▶ rank 1
//        rank 2 ──g2──▶ │ rank 0 │ ──θ──▶ rank 2        rank 0: (N−1)·Ψ·4 bytes in, (N−1)·Ψ·4 out
//        rank 3 ──g3──▶ └────────┘ ──θ──▶ rank 3        others: Ψ·4 in, Ψ·4 out
//
// Both halves are written from point-to-point messages, one rank after another, so that the
// counters show exactly what rank 0 moves: its traffic grows with N while every other rank's
// stays Ψ·4 — and so does its time, since one rank's links and memory serve everyone.
// (MPI_Reduce / MPI_Bcast would move the same payload through a tree, hiding the cost in the
// library; the lesson is the star, not the tree.)
// In 16 bits (--precision bf16|fp16, common/mixed_precision.hpp) the star carries the 16-bit
// gradients (Ψ·2 bytes per message), pre-divided by N in the backward seed, and rank 0 adds them
// with one 16-bit addition each, in rank order: chapter 02's 16-bit accumulation; rank 0 alone
// holds the fp32 master weights and broadcasts the 16-bit parameters (train_step_mixed below).
// Leaves out: overlapping communication with backward, and tree or ring schedules (chapter 04).
#pragma once

#include <optional>
#include <span>
#include <string>

#include "common/check.hpp"
#include "common/comm.hpp"
#include "common/dist.hpp"
#include "common/dist_eval.hpp"
#include "common/lesson.hpp"
#include "common/metrics.hpp"
#include "common/mixed_precision.hpp"
#include "common/train.hpp"

namespace ringzero {

/// Sum of every rank's `grads` into rank 0's `grads`, in rank order (((g0 + g1) + g2) + ...:
/// the order chapter 02 accumulates its micro-batches in). Rank 0 receives each rank's Ψ
/// floats into `scratch` (at least grads.size() elements) and adds them; ranks 1..N−1 send and
/// keep their `grads` unchanged. Counted as "central_reduce".
inline void reduce_to_rank0(Communicator& comm, std::span<float> grads, std::span<float> scratch) {
  comm.count_call("central_reduce");
  Communicator::Scope scope(comm, "central_reduce");
  // BEGIN EXERCISE 03.1 (central reducer: gather and sum on rank 0)
  if (comm.rank() != 0) {
    comm.send(grads, /*dest=*/0);
    return;
  }
  RZ_CHECK(scratch.size() >= grads.size(),
           "reduce_to_rank0: scratch " << scratch.size() << " < " << grads.size());
  for (int src = 1; src < comm.world_size(); ++src) {
    comm.recv(scratch.first(grads.size()), src);  // blocks until rank `src` has finished backward
    float* __restrict g = grads.data();
    const float* __restrict in = scratch.data();
    for (size_t i = 0; i < grads.size(); ++i) g[i] += in[i];
  }
  // END EXERCISE 03.1
}

/// Rank 0's `params` copied to every other rank: rank 0 sends Ψ floats to ranks 1..N−1 in
/// turn, each of them receives into its `params`. Counted as "central_broadcast".
inline void broadcast_from_rank0(Communicator& comm, std::span<float> params) {
  comm.count_call("central_broadcast");
  Communicator::Scope scope(comm, "central_broadcast");
  // BEGIN EXERCISE 03.2 (central reducer: broadcast from rank 0)
  if (comm.rank() != 0) {
    comm.recv(params, /*src=*/0);
    return;
  }
  for (int dest = 1; dest < comm.world_size(); ++dest) comm.send(params, dest);
  // END EXERCISE 03.2
}

/// reduce_to_rank0 on 16-bit gradients (bf16 or fp16 bits): Ψ·2 bytes per message, and rank
/// 0 adds each rank's gradient with one 16-bit addition (accumulate_half: the sum formed in
/// fp32, rounded once), in rank order: chapter 02's 16-bit accumulation of its micro-batches.
inline void reduce_to_rank0(Communicator& comm, std::span<uint16_t> grads,
                            std::span<uint16_t> scratch, Dtype dtype) {
  comm.count_call("central_reduce");
  Communicator::Scope scope(comm, "central_reduce");
  if (comm.rank() != 0) {
    comm.send(std::span<const uint16_t>(grads), /*dest=*/0);
    return;
  }
  RZ_CHECK(scratch.size() >= grads.size(),
           "reduce_to_rank0: scratch " << scratch.size() << " < " << grads.size());
  for (int src = 1; src < comm.world_size(); ++src) {
    comm.recv(scratch.first(grads.size()), src);
    accumulate_half(dtype, grads, scratch.first(grads.size()));
  }
}

/// broadcast_from_rank0 on 16-bit parameters: Ψ·2 bytes per message.
inline void broadcast_from_rank0(Communicator& comm, std::span<uint16_t> params) {
  comm.count_call("central_broadcast");
  Communicator::Scope scope(comm, "central_broadcast");
  if (comm.rank() != 0) {
    comm.recv(params, /*src=*/0);
    return;
  }
  for (int dest = 1; dest < comm.world_size(); ++dest)
    comm.send(std::span<const uint16_t>(params), dest);
}

/// Bytes each rank moves per optimizer step, for the end-of-run table: rank 0 receives
/// (N − 1)·Ψ·g and sends (N − 1)·Ψ·p, every other rank sends Ψ·g and receives Ψ·p, with g and p
/// the bytes of a gradient and a parameter element on the wire: 4 in fp32, 2 in 16 bits (the
/// gradients take 4 again with --reduce-dtype fp32).
inline TrafficTheory central_reducer_traffic(int world_size, int64_t psi, int grad_bytes = 4,
                                             int param_bytes = 4) {
  TrafficTheory theory;
  for (int r = 0; r < world_size; ++r) {
    const int64_t n = (r == 0 ? world_size - 1 : 1) * psi;
    theory.bytes_sent.push_back(n * (r == 0 ? param_bytes : grad_bytes));
    theory.bytes_received.push_back(n * (r == 0 ? grad_bytes : param_bytes));
  }
  const std::string g = std::to_string(grad_bytes), p = std::to_string(param_bytes);
  const double rest = static_cast<double>(psi);
  theory.formula = grad_bytes == param_bytes
                       ? "theory (central reducer): rank 0 receives and sends (N-1)·Ψ·" + g +
                             " = " + human_bytes(static_cast<double>(theory.bytes_sent[0])) +
                             " per step, every other rank Ψ·" + g + " = " +
                             human_bytes(grad_bytes * rest)
                       : "theory (central reducer): rank 0 receives (N-1)·Ψ·" + g + " = " +
                             human_bytes(static_cast<double>(theory.bytes_received[0])) +
                             " of gradients and sends (N-1)·Ψ·" + p + " = " +
                             human_bytes(static_cast<double>(theory.bytes_sent[0])) +
                             " of parameters per step, every other rank Ψ·" + g + " and Ψ·" + p;
  theory.formula += "; N = " + std::to_string(world_size) + ", Ψ = " + std::to_string(psi);
  return theory;
}

/// Chapter 03's lesson object: the only optimizer (on rank 0) and rank 0's buffer for one
/// incoming gradient; train_step() below is the step it drives. In 16 bits `mixed` holds the
/// 16-bit model on every rank and the fp32 master weights on rank 0 only.
class CentralReducer : public Lesson {
 public:
  explicit CentralReducer(SetUp& s)
      : comm(*s.comm),
        mixed(make_mixed_precision(s.model, s.config, /*master_weights=*/comm.rank() == 0)),
        psi_(s.model.num_parameters()),
        states_(fp32_state_bytes(s.config.optimizer, s.config.momentum)) {
    const int64_t incoming = comm.rank() == 0 ? psi_ : 0;  // (Ψ) one gradient, rank 0 only
    if (!mixed) {
      if (comm.rank() == 0) optimizer.emplace(s.config, parameter_sizes(s.model));  // rank 0 only
      scratch = Buffer(incoming, MemTag::comm_buffers);
    } else if (mixed->reduce_dtype() == Dtype::fp32) {  // widen, sum in fp32
      grads32 = Buffer(psi_, MemTag::comm_buffers);
      scratch = Buffer(incoming, MemTag::comm_buffers);
    } else {
      scratch16 = Buffer16(incoming, MemTag::comm_buffers);
    }
  }
  std::string ledger_formula(int64_t psi) const override {
    if (mixed) return ledger_formula_mixed(psi);
    return "formula (" + std::string(states_.name) + " on rank 0 only): rank 0 " +
           full_copy_formula_text(states_) + " = " +
           human_bytes(states_.per_param() * static_cast<double>(psi)) +
           ", other ranks 4Ψ + 4Ψ = 8Ψ = " + human_bytes(8.0 * psi) +
           "; rank 0's comm_buffers: one gradient, 4Ψ";
  }
  TrafficTheory traffic_theory() const override {
    if (!mixed) return central_reducer_traffic(comm.world_size(), psi_);
    const int grad_bytes = mixed->reduce_dtype() == Dtype::fp32 ? 4 : 2;
    return central_reducer_traffic(comm.world_size(), psi_, grad_bytes, /*param_bytes=*/2);
  }
  // In 16 bits the fp32 model existed during set-up only; the peaks start after it.
  bool reset_ledger_peaks() const override { return mixed != nullptr; }
  nlohmann::json summary_fields() const override {
    return mixed ? mixed->summary() : nlohmann::json::object();
  }
  std::map<std::string, NamedTensor> model_state_dict(const Model& model) override {
    if (!mixed) return state_dict(model);
    return mixed->has_master_weights() ? mixed->master_state_dict(model)  // rank 0 writes it
                                       : std::map<std::string, NamedTensor>{};
  }

  TrainingState training_state(Model& model) override {  // rank 0 writes; every rank loads
    return replicated_state(model, optimizer ? &*optimizer : nullptr, "");
  }

  Communicator& comm;
  std::unique_ptr<MixedPrecision> mixed;  ///< null in fp32; first, before any gradient hook
  std::optional<Optimizer> optimizer;     ///< fp32, rank 0 only: the others never step
  Buffer scratch;                         ///< rank 0: (Ψ) one incoming fp32 gradient
  Buffer16 scratch16;                     ///< 16 bits, rank 0: (Ψ) one incoming 16-bit gradient
  Buffer grads32;                         ///< --reduce-dtype fp32: (Ψ) the gradient widened

 private:
  std::string ledger_formula_mixed(int64_t psi) const {
    const std::string d = dtype_name(mixed->dtype());
    const bool half = mixed->reduce_dtype() != Dtype::fp32;
    return "formula (" + d + " + AdamW with fp32 master weights on rank 0 only): rank 0 " +
           "2Ψ + 2Ψ + 12Ψ = 16Ψ = " + human_bytes(16.0 * psi) +
           ", other ranks 2Ψ + 2Ψ = 4Ψ = " + human_bytes(4.0 * psi) + "; comm_buffers: " +
           (half ? "rank 0's one incoming " + d + " gradient, 2Ψ"
                 : "every rank's gradient widened to fp32, 4Ψ, and rank 0's incoming one, 4Ψ") +
           "; activations: one layer's fp32 working copy and gradient scratch";
  }
  int64_t psi_;
  StateBytes states_;  // bytes per parameter in fp32: p, g and --optimizer's state
};

/// train_step in 16 bits: the same star on the 16-bit gradients (or on fp32 copies of them,
/// --reduce-dtype fp32). Backward's seed is loss_scale/(N·K), so each rank's gradient is already
/// divided by N (pre-divided, as PyTorch's DDP divides before its all-reduce) and rank 0's
/// 16-bit sum is the mean: no division after it, and the sum cannot overflow by a factor N.
inline double train_step_mixed(CentralReducer& reducer, const Step& step) {
  Communicator& comm = reducer.comm;
  MixedPrecision& mixed = *reducer.mixed;
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

  std::span<const float> grads32;    // empty: rank 0's optimizer reads the 16-bit sum
  if (reducer.grads32.size() > 0) {  // --reduce-dtype fp32: Ψ·4 per message, summed in fp32
    convert_to_float(mixed.dtype(), half.grads16.span(), reducer.grads32.span());
    reduce_to_rank0(comm, reducer.grads32.span(), reducer.scratch.span());
    grads32 = reducer.grads32.span();
  } else {  // Ψ·2 per message, 16-bit sums
    reduce_to_rank0(comm, half.grads16.span(), reducer.scratch16.span(), mixed.dtype());
  }
  // fp16: only rank 0 holds the sum; its overflow verdict goes to every rank (update_scale),
  // so every rank's loss scale follows rank 0's and a skipped step is skipped everywhere.
  const bool found_inf = comm.rank() == 0 && mixed.found_inf(grads32);
  if (mixed.update_scale(found_inf, &comm) && comm.rank() == 0)
    mixed.step_master(step.config.clip_grad_norm, grads32);
  broadcast_from_rank0(comm, half.params16.span());  // everyone continues from rank 0's weights
  return loss_value;
}

/// One optimizer step on the global batch: K micro-steps on this rank's share, then the
/// central reducer. Returns the global batch's mean loss (on every rank). Errors: a non-finite
/// loss stops every rank (check_finite_loss: the global mean is the same everywhere; the error
/// names the rank(s) whose own loss is not finite).
inline double train_step(CentralReducer& reducer, const Step& step) {
  if (reducer.mixed) return train_step_mixed(reducer, step);
  Communicator& comm = reducer.comm;
  Model& model = step.model;
  const int64_t K = step.config.grad_accum_steps;
  const int N = comm.world_size();
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

  std::span<float> grads = model.grads_memory.span(), params = model.params_memory.span();
  reduce_to_rank0(comm, grads, reducer.scratch.span());  // rank 0: Σ over ranks of share means
  if (comm.rank() == 0) {
    for (float& g : grads) g /= N;  // mean of N equal shares = global-batch mean
    if (step.config.clip_grad_norm > 0) clip_grad_norm(grads, step.config.clip_grad_norm);
    reducer.optimizer->step(params, grads);
  }
  broadcast_from_rank0(comm, params);  // everyone continues from rank 0's weights
  return loss_value;
}

}  // namespace ringzero
