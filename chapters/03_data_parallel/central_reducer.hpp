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

/// Bytes each rank moves per optimizer step, for the end-of-run table: rank 0 receives and
/// sends (N − 1)·Ψ·4, every other rank Ψ·4 each way.
inline TrafficTheory central_reducer_traffic(int world_size, int64_t psi) {
  TrafficTheory theory;
  for (int r = 0; r < world_size; ++r) {
    const int64_t bytes = (r == 0 ? world_size - 1 : 1) * psi * 4;
    theory.bytes_sent.push_back(bytes);
    theory.bytes_received.push_back(bytes);
  }
  theory.formula = "theory (central reducer): rank 0 receives and sends (N-1)·Ψ·4 = " +
                   human_bytes(static_cast<double>(theory.bytes_sent[0])) +
                   " per step, every other rank Ψ·4 = " + human_bytes(4.0 * psi) +
                   "; N = " + std::to_string(world_size) + ", Ψ = " + std::to_string(psi);
  return theory;
}

/// Chapter 03's lesson object: the only optimizer (on rank 0) and rank 0's buffer for one
/// incoming gradient; train_step() below is the step it drives.
class CentralReducer : public Lesson {
 public:
  explicit CentralReducer(SetUp& s)
      : comm(*s.comm),
        psi_(s.model.num_parameters()),
        states_(fp32_state_bytes(s.config.optimizer, s.config.momentum)) {
    if (comm.rank() == 0) optimizer.emplace(s.config, parameter_sizes(s.model));  // rank 0 only
    scratch = Buffer(comm.rank() == 0 ? psi_ : 0, MemTag::comm_buffers);  // (Ψ) one gradient
  }
  std::string ledger_formula(int64_t psi) const override {
    return "formula (" + std::string(states_.name) + " on rank 0 only): rank 0 " +
           full_copy_formula_text(states_) + " = " +
           human_bytes(states_.per_param() * static_cast<double>(psi)) +
           ", other ranks 4Ψ + 4Ψ = 8Ψ = " + human_bytes(8.0 * psi) +
           "; rank 0's comm_buffers: one gradient, 4Ψ";
  }
  TrafficTheory traffic_theory() const override {
    return central_reducer_traffic(comm.world_size(), psi_);
  }

  TrainingState training_state(Model& model) override {  // rank 0 writes; every rank loads
    return replicated_state(model, optimizer ? &*optimizer : nullptr, "");
  }

  Communicator& comm;
  std::optional<Optimizer> optimizer;  ///< rank 0 only: the others never step
  Buffer scratch;                      ///< rank 0: (Ψ) one incoming gradient; others: empty

 private:
  int64_t psi_;
  StateBytes states_;  // bytes per parameter in fp32: p, g and --optimizer's state
};

/// One optimizer step on the global batch: K micro-steps on this rank's share, then the
/// central reducer. Returns the global batch's mean loss (on every rank). Errors: a non-finite
/// loss stops every rank (check_finite_loss: the global mean is the same everywhere; the error
/// names the rank(s) whose own loss is not finite).
inline double train_step(CentralReducer& reducer, const Step& step) {
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
