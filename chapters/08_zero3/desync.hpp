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
// The check itself is common/collective_check.hpp's, shared with chapters 05-07 (which run
// it under --check-collectives); this chapter runs it always, as part of its traffic.
// Leaves out: checking the data's contents, and divergences that post the same collectives
// (a rank that skips a layer's compute but not its hooks computes garbage, in step).
#pragma once

#include <functional>
#include <string>

#include "common/collective_check.hpp"
#include "common/comm.hpp"

namespace ringzero {

/// Collective, on every rank, right before the collective `mine` describes (its id is the
/// layer): swaps headers with the ring neighbours and fails if rank r − 1's differs from ours,
/// with both `describe`d (common/collective_check.hpp, which chapters 05-07 share). Counted as
/// the operation "desync_check". World size 1: nothing to check.
inline void check_in_step(Communicator& comm, const CollectiveHeader& mine,
                          const std::function<std::string(const CollectiveHeader&)>& describe) {
  check_collective(
      comm, mine, describe,
      "Every rank must run the same layers in the same order: a layer run on some ranks only (a "
      "branch on one rank's data, a layer called twice) pairs different collectives across "
      "ranks, a hang or silently wrong weights",
      "desync_check");
}

}  // namespace ringzero
