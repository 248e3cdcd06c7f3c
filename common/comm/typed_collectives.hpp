// typed_collectives: MPI's reduce-scatter and all-gather over an element type (float, bf16,
// fp16), so that an engine written over its element types calls one function whatever they
// are. float goes to the communicator (MPI_Reduce_scatter_block, MPI_Allgather); MPI has no
// bf16/fp16 sum, so the 16-bit overloads stop with an error naming the fix, and the chapters
// refuse --collectives mpi in 16 bits before training. The in-place forms take and leave a
// rank's block inside the whole buffer, as the ring does (chapters 06-08's padded units).
// Leaves out: the ring (chapter 04's ring.hpp, written over the element type too).
#pragma once

#include <span>
#include <string>
#include <type_traits>

#include "common/comm/collectives.hpp"
#include "common/comm/comm.hpp"
#include "common/core/check.hpp"
#include "common/core/device_memory.hpp"
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

/// Collective: MPI_Reduce_scatter_block of `buf` (N·s elements) in place: afterwards this rank's
/// block buf[r s, (r+1) s) holds the sum over ranks of its block. MPI wants the output apart
/// from the input, so the sum lands in `scratch` (≥ s elements) and is copied back. 16 bits: an
/// error, as mpi_reduce_scatter.
template <Element T>
void mpi_reduce_scatter_in_place(Communicator& comm, std::span<T> buf, std::span<T> scratch) {
  const size_t s = buf.size() / static_cast<size_t>(comm.world_size());
  mpi_reduce_scatter(comm, buf, scratch.first(s));
  copy_elements(scratch.first(s), buf.subspan(comm.rank() * s, s));
}
/// Collective: MPI_Allgather in place: every rank's block buf[r s, (r+1) s) of `buf` (N·s
/// elements) is copied to every rank, through `scratch` (≥ s elements: MPI wants the input apart
/// from the output). 16 bits: an error, as mpi_all_gather.
template <Element T>
void mpi_all_gather_in_place(Communicator& comm, std::span<T> buf, std::span<T> scratch) {
  const size_t s = buf.size() / static_cast<size_t>(comm.world_size());
  copy_elements(buf.subspan(comm.rank() * s, s), scratch.first(s));
  mpi_all_gather(comm, scratch.first(s), buf);
}

}  // namespace ringzero
