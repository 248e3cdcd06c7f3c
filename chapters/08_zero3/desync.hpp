// Desync check: every collective starts by swapping a 16-byte header with its ring neighbours.
//
// ZeRO-3 makes a collective per layer, per forward and backward, so a rank that runs one layer
// more than the others (a branch on its own data, a layer called twice) posts one collective
// more. Paired with another rank's collective of another layer, that is a hang (two ranks
// waiting on each other) or silently wrong weights (two layers of the same size exchanged).
// PyTorch's TORCH_DISTRIBUTED_DEBUG=DETAIL catches it the same way: it checks every
// collective's description across ranks before running it.
//
// Before its data, every collective sends (sequence number, layer, kind, size) to rank r + 1
// and receives rank r − 1's. The header swap cannot mismatch itself: it has the same size in
// every collective, and until the first divergence every rank has posted the same ones. At
// the first divergence the ranks' headers differ, so some rank sees a header unlike its own
// (if no two neighbours differ, none differ) and fails, naming both; run_main's MPI_Abort
// then stops every rank. The rank that runs ahead is caught too: its extra collective meets
// the others' next one, whose header differs. Cost: 16 bytes per collective, counted apart.
// Leaves out: checking the data's contents, and divergences that post the same collectives
// (a rank that skips a layer's compute but not its hooks computes garbage, in step).
#pragma once

#include <array>
#include <bit>
#include <cstdint>
#include <functional>
#include <string>

#include "chapters/04_ring_allreduce/ring.hpp"
#include "common/check.hpp"
#include "common/comm.hpp"

namespace ringzero {

/// What a collective is, in 16 bytes: the sequence number of this rank's collectives (mod
/// 2^32), the layer, the kind (what for) and the number of elements.
struct CollectiveHeader {
  uint32_t seq = 0, layer = 0, kind = 0, size = 0;
  bool operator==(const CollectiveHeader&) const = default;
};

/// Collective, on every rank, right before the collective `mine` describes: swaps headers with
/// the ring neighbours and fails if rank r − 1's differs from ours, with both `describe`d.
/// Counted as the operation "desync_check". World size 1: nothing to check.
inline void check_in_step(Communicator& comm, const CollectiveHeader& mine,
                          const std::function<std::string(const CollectiveHeader&)>& describe) {
  const int N = comm.world_size(), r = comm.rank();
  if (N == 1) return;
  comm.count_call("desync_check");
  Communicator::Scope scope(comm, "desync_check");
  std::array<float, 4> received{};  // the header's bytes; MPI copies them as they are
  comm.sendrecv(std::bit_cast<std::array<float, 4>>(mine), ring_mod(r + 1, N), received,
                ring_mod(r - 1, N));
  const auto left = std::bit_cast<CollectiveHeader>(received);
  RZ_CHECK(
      left == mine,
      "ranks out of step: "
          << describe(mine) << " on this rank, but " << describe(left) << " on rank "
          << ring_mod(r - 1, N) << ". Every rank must run the same layers in the same order: a "
          << "layer run on some ranks only (a branch on one rank's data, a layer called twice) "
          << "pairs different collectives across ranks, a hang or silently wrong weights");
}

}  // namespace ringzero
