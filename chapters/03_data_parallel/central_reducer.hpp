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
// Both are written once over the element type (float, bf16, fp16: common/core/half.hpp), so the
// same star carries 16-bit gradients and parameters with --precision bf16|fp16 (Ψ·2 bytes per
// message; rank 0 adds each one with bf16/fp16's `+=`, one rounding per addition).
// Provides: reduce_to_rank0, broadcast_from_rank0, their traffic and CentralReducer, the lesson
// object (rank 0's optimizer and what the driver reports of it); the step is step.hpp's.
// Leaves out: overlapping communication with backward, tree or ring schedules (chapter 04), the
// precision (common/precision/precision.hpp).
#pragma once

#include <optional>
#include <span>
#include <string>

#include "common/comm/comm.hpp"
#include "common/core/check.hpp"
#include "common/driver/dist_eval.hpp"
#include "common/driver/replicated_lesson.hpp"
#include "common/driver/train.hpp"
#include "common/report/dist.hpp"
#include "common/report/metrics.hpp"

namespace ringzero {

/// Sum of every rank's `grads` into rank 0's `grads`, in rank order (((g0 + g1) + g2) + ...:
/// the order chapter 02 accumulates its micro-batches in). Rank 0 receives each rank's Ψ
/// elements into `scratch` (at least grads.size() elements) and adds them; ranks 1..N−1 send and
/// keep their `grads` unchanged. T: float, bf16 or fp16. Counted as "central_reduce". Comm: the
/// Communicator (a grader passes its own, with the same members, as for chapter 04's ring).
template <class Comm, class T>
void reduce_to_rank0(Comm& comm, std::span<T> grads, std::span<T> scratch) {
  comm.count_call("central_reduce");
  typename Comm::Scope scope(comm, "central_reduce");
  // BEGIN EXERCISE 03.1 (central reducer: gather and sum on rank 0)
  if (comm.rank() != 0) {
    comm.send(grads, /*dest=*/0);
    return;
  }
  RZ_CHECK(scratch.size() >= grads.size(),
           "reduce_to_rank0: scratch " << scratch.size() << " < " << grads.size());
  for (int src = 1; src < comm.world_size(); ++src) {
    comm.recv(scratch.first(grads.size()), src);  // blocks until rank `src` has finished backward
    add_into(grads, std::span<const T>(scratch.first(grads.size())));  // g[i] += in[i], every i
  }
  // END EXERCISE 03.1
}

/// Rank 0's `params` copied to every other rank: rank 0 sends Ψ elements to ranks 1..N−1 in
/// turn, each of them receives into its `params`. T: float, bf16 or fp16. Counted as
/// "central_broadcast". Comm: as reduce_to_rank0's.
template <class Comm, class T>
void broadcast_from_rank0(Comm& comm, std::span<T> params) {
  comm.count_call("central_broadcast");
  typename Comm::Scope scope(comm, "central_broadcast");
  // BEGIN EXERCISE 03.2 (central reducer: broadcast from rank 0)
  if (comm.rank() != 0) {
    comm.recv(params, /*src=*/0);
    return;
  }
  for (int dest = 1; dest < comm.world_size(); ++dest) comm.send(params, dest);
  // END EXERCISE 03.2
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
/// incoming gradient; train_step() (step.hpp) is the step it drives.
class CentralReducer : public ReplicatedLesson {
 public:
  explicit CentralReducer(SetUp& s)  // the optimizer on rank 0 only
      : ReplicatedLesson(s.model, s.config, s.comm->world_size(), s.comm->rank() == 0),
        comm(*s.comm),
        psi_(s.model.num_parameters()),
        states_(fp32_state_bytes(s.config.optimizer, s.config.momentum)) {
    precision.reserve_scratch(comm.rank() == 0 ? psi_ : 0);  // (Ψ) one gradient, rank 0 only
  }
  std::string ledger_formula(int64_t psi) const override {
    if (!precision.is_fp32()) return ledger_formula_mixed(psi);
    return "formula (" + std::string(states_.name) + " on rank 0 only): rank 0 " +
           full_copy_formula_text(states_) + " = " +
           human_bytes(states_.per_param() * static_cast<double>(psi)) +
           ", other ranks 4Ψ + 4Ψ = 8Ψ = " + human_bytes(8.0 * psi) +
           "; rank 0's comm_buffers: one gradient, 4Ψ";
  }
  TrafficTheory traffic_theory() const override {
    return central_reducer_traffic(comm.world_size(), psi_, precision.grad_wire_bytes(),
                                   precision.param_bytes());
  }
  /// The whole gradient to rank 0, which steps alone (the GPU planner reads it).
  std::optional<EngineDescription> description() const override {
    return EngineDescription{.unit = "model",
                             .unit_sizes = {psi_},
                             .central = true,
                             .world_size = comm.world_size(),
                             .reset_ledger_peaks = precision.reset_ledger_peaks()};
  }

  Communicator& comm;

 private:
  std::string ledger_formula_mixed(int64_t psi) const {
    const std::string d = dtype_name(precision.dtype());
    const bool half = precision.grad_wire_bytes() == 2;
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

}  // namespace ringzero
