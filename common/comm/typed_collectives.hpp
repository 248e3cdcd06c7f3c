// typed_collectives: MPI's reduce-scatter and all-gather over an element type (float, bf16,
// fp16), so that an engine written over its element types calls one function whatever they
// are. float goes to the communicator (MPI_Reduce_scatter_block, MPI_Allgather); MPI has no
// bf16/fp16 sum, so the 16-bit overloads stop with an error naming the fix, and the chapters
// refuse --collectives mpi in 16 bits before training.
// Leaves out: the ring (chapter 04's ring.hpp, written over the element type too).
#pragma once

#include <span>
#include <string>
#include <type_traits>

#include "common/comm/collectives.hpp"
#include "common/comm/comm.hpp"
#include "common/core/check.hpp"
#include "common/core/half.hpp"

namespace ringzero {

/// Errors, before training, unless `collectives` can run on T: --collectives mpi needs float
/// (MPI has no bf16/fp16 sum). `precision`: --precision's value, for the message.
template <Element T>
void check_collectives_for(Collectives collectives, const std::string& precision) {
  RZ_CHECK((std::is_same_v<T, float> || collectives == Collectives::ring),
           "--collectives mpi with --precision "
               << precision << ": MPI has no " << precision
               << " sum, so 16-bit parameters and gradients go through chapter 04's ring only; "
                  "drop --collectives mpi (ring is the default) or use --precision fp32");
}

/// Collective: MPI_Reduce_scatter_block of `in` (N·out.size() elements) into `out`.
inline void mpi_reduce_scatter(Communicator& comm, std::span<float> in, std::span<float> out) {
  comm.reduce_scatter(in, out);
}
/// Collective: MPI_Allgather of `in` into `out` (N·in.size() elements).
inline void mpi_all_gather(Communicator& comm, std::span<float> in, std::span<float> out) {
  comm.all_gather(in, out);
}
/// The 16-bit overloads: errors (MPI has no bf16/fp16 sum; 16-bit runs use the ring).
template <Half T>
void mpi_reduce_scatter(Communicator&, std::span<T>, std::span<T>) {
  RZ_CHECK(false, "--collectives mpi: MPI has no bf16/fp16 sum; use --collectives ring");
}
template <Half T>
void mpi_all_gather(Communicator&, std::span<T>, std::span<T>) {
  RZ_CHECK(false, "--collectives mpi: 16-bit runs gather with the ring; use --collectives ring");
}

}  // namespace ringzero
