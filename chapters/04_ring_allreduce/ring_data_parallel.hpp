// Chapter 04's lesson: data parallel where every rank all-reduces the gradients (ring.hpp) and
// steps its own, identical optimizer.
//
// Provides: RingDataParallel (the replicated optimizer and the ring's receive buffer), its
// Flags (--collectives, --bench-allreduce) and all_reduce_gradients(); the step is step.hpp's.
// Leaves out: the ring itself (ring.hpp), overlap with backward (chapter 05), the precision
// (common/precision.hpp: the same step in bf16 and fp16, with 16-bit gradients on the wire).
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
#include "common/precision.hpp"
#include "common/run.hpp"
#include "common/train.hpp"

namespace ringzero {

/// Sum over ranks of each parameter's gradient, in place: one all-reduce per parameter, in
/// registration order, as PyTorch's first DDP prototype (one all-reduce per parameter after
/// backward) does. T: the gradients' element type on the wire (float, bf16, fp16). `scratch`:
/// at least one ring chunk of the largest parameter.
template <class T>
void all_reduce_gradients(Communicator& comm, const Model& model, bool ring, std::span<T> grads,
                          std::span<T> scratch) {
  for (size_t p = 0; p < model.parameters().size(); ++p) {
    std::span<T> grad = grads.subspan(model.offsets()[p], model.parameters()[p]->numel());
    all_reduce(comm, grad, scratch, ring);  // our ring, or MPI_Allreduce
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
        precision(s.model, s.config, comm.world_size()),  // every rank holds the optimizer
        ring(flags.collectives == Collectives::ring),
        sizes_(parameter_sizes(s.model)),
        psi_(s.model.num_parameters()),
        states_(fp32_state_bytes(s.config.optimizer, s.config.momentum)) {
    RZ_CHECK(ring || precision.grad_wire_bytes() == 4,
             "--collectives mpi with --reduce-dtype "
                 << s.config.precision
                 << " (--reduce-dtype defaults to the --precision): MPI has no "
                 << s.config.precision
                 << " sum; use --reduce-dtype fp32 (widen and sum in fp32) or --collectives ring");
    const int64_t largest = *std::max_element(sizes_.begin(), sizes_.end());
    precision.reserve_scratch(ring_chunk(largest, comm.world_size(), 0).size);  // one chunk
  }

  std::string banner() const override {
    return std::string(" | collectives ") + (ring ? "ring" : "mpi");
  }
  std::string ledger_formula(int64_t psi) const override {
    if (!precision.is_fp32()) return ledger_formula_mixed(psi);
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
    return ring_all_reduce_traffic(sizes_, N, precision.grad_wire_bytes());
  }
  bool reset_ledger_peaks() const override { return precision.reset_ledger_peaks(); }
  /// One all-reduce per parameter, after backward (the GPU planner reads it).
  std::optional<EngineDescription> description() const override {
    return EngineDescription{.unit = "parameters",
                             .unit_sizes = sizes_,
                             .collectives = ring ? Collectives::ring : Collectives::mpi,
                             .world_size = comm.world_size(),
                             .reset_ledger_peaks = precision.reset_ledger_peaks()};
  }
  nlohmann::json summary_fields() const override {
    nlohmann::json j{{"collectives", ring ? "ring" : "mpi"}};
    j.update(precision.summary());
    return j;
  }
  std::map<std::string, NamedTensor> model_state_dict(const Model& model) override {
    return precision.state_dict(model);
  }
  TrainingState training_state(Model& model) override { return precision.training_state(model); }

  Communicator& comm;
  ReplicatedPrecision precision;  ///< every rank's optimizer; the ring's incoming chunk
  bool ring;                      ///< our ring (true) or MPI_Allreduce

 private:
  std::string ledger_formula_mixed(int64_t psi) const {
    const bool half = precision.grad_wire_bytes() == 2;
    return "formula (" + std::string(dtype_name(precision.dtype())) +
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

}  // namespace ringzero
