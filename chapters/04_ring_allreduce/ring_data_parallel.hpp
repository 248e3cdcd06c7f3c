// Chapter 04's lesson: data parallel where every rank all-reduces the gradients (ring.hpp) and
// steps its own, identical optimizer.
//
// Provides: RingDataParallel (the replicated optimizer and the ring's receive buffer), its
// Flags (--collectives, --bench-allreduce), all_reduce_gradients() and train_step().
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
        optimizer(s.config, parameter_sizes(s.model)),  // every rank: replicated optimizer state
        ring(flags.collectives == Collectives::ring),
        sizes_(parameter_sizes(s.model)),
        psi_(s.model.num_parameters()),
        states_(fp32_state_bytes(s.config.optimizer, s.config.momentum)) {
    const int64_t largest = *std::max_element(sizes_.begin(), sizes_.end());
    scratch = Buffer(ring_chunk(largest, comm.world_size(), 0).size,
                     MemTag::comm_buffers);  // (ceil(Ψ_p / N)) one incoming chunk
  }
  std::string banner() const override {
    return std::string(" | collectives ") + (ring ? "ring" : "mpi");
  }
  std::string ledger_formula(int64_t psi) const override {
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
    return ring_all_reduce_traffic(sizes_, N);
  }
  nlohmann::json summary_fields() const override {
    return {{"collectives", ring ? "ring" : "mpi"}};
  }

  Communicator& comm;
  TrainingState training_state(Model& model) override {
    return replicated_state(model, &optimizer, "");
  }
  Optimizer optimizer;
  bool ring;       ///< our ring (true) or MPI_Allreduce
  Buffer scratch;  ///< one incoming ring chunk of the largest parameter

 private:
  std::vector<int64_t> sizes_;
  int64_t psi_;
  StateBytes states_;  // bytes per parameter in fp32: p, g and --optimizer's state
};

/// One optimizer step on the global batch: K micro-steps on this rank's share, the all-reduce,
/// and the same optimizer step on every rank. Returns the global batch's mean loss (on every
/// rank). Errors: a non-finite loss stops every rank.
inline double train_step(RingDataParallel& dp, const Step& step) {
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
