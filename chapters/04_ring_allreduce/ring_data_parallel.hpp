// Chapter 04's lesson: data parallel where every rank all-reduces the gradients (ring.hpp) and
// steps its own, identical optimizer.
//
// Provides: RingDataParallel (the replicated optimizer and the ring's receive buffer), its
// Flags (--collectives, --bench-allreduce) and all_reduce_gradients(); the step is step.hpp's.
// Leaves out: the ring itself (ring.hpp), overlap with backward (chapter 05), the precision
// (common/precision/precision.hpp: the same step in bf16 and fp16, 16-bit gradients on the wire).
#pragma once

#include <algorithm>
#include <numeric>
#include <span>
#include <string>

#include "chapters/04_ring_allreduce/ring.hpp"
#include "common/comm/collectives.hpp"
#include "common/driver/replicated_lesson.hpp"
#include "common/driver/run.hpp"
#include "common/report/bench_allreduce.hpp"
#include "common/report/dist.hpp"

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
class RingDataParallel : public ReplicatedLesson {
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
      if (bench) bench_allreduce(*comm, ring_all_reduce<float>);  // ours vs MPI_Allreduce, timed
      return bench;
    }
  };

  RingDataParallel(SetUp& s, const Flags& flags)
      : ReplicatedLesson(s.model, s.config, s.comm->world_size()),  // every rank steps
        comm(*s.comm),
        ring(flags.collectives == Collectives::ring),
        sizes_(parameter_sizes(s.model)) {
    precision.check_collectives(flags.collectives);  // MPI has no 16-bit sum
    const int64_t largest = *std::max_element(sizes_.begin(), sizes_.end());
    precision.reserve_scratch(ring_chunk(largest, comm.world_size(), 0).size);  // one chunk
  }

  std::string ledger_formula(int64_t) const override {
    return precision.replicated_ledger_formula("parameter");  // every rank holds every state
  }
  TrafficTheory traffic_theory() const override {
    if (!ring)
      return mpi_all_reduce_traffic(std::reduce(sizes_.begin(), sizes_.end()), comm.world_size());
    return ring_all_reduce_traffic(sizes_, comm.world_size(), precision.grad_wire_bytes());
  }
  /// One all-reduce per parameter, after backward (the banner, the summary and the GPU planner
  /// read it).
  std::optional<EngineDescription> description() const override {
    return EngineDescription{.unit = "parameters",
                             .unit_sizes = sizes_,
                             .collectives = ring ? Collectives::ring : Collectives::mpi,
                             .world_size = comm.world_size(),
                             .reset_ledger_peaks = precision.reset_ledger_peaks()};
  }

  Communicator& comm;
  bool ring;                      ///< our ring (true) or MPI_Allreduce

 private:
  std::vector<int64_t> sizes_;  // (parameters) Ψ_p each, in registration order
};

}  // namespace ringzero
