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
// The check itself is common/checks/collective_check.hpp's, run by the communication queue
// (common/comm/comm_queue.hpp) as for chapters 05-07 (which run it under --check-collectives); this
// chapter runs it always, as part of its traffic.
// Leaves out: checking the data's contents, and divergences that post the same collectives
// (a rank that skips a layer's compute but not its hooks computes garbage, in step).
#pragma once

#include <cstdio>
#include <string>

#include "chapters/08_zero3/layer_shard.hpp"
#include "common/checks/collective_check.hpp"

namespace ringzero {

/// A desync header in words, e.g. "ZeRO-3 collective #9 is the all-gather of layer 2 for its
/// forward (1234 elements)". h.kind is Zero3::Kind (forward gather, backward gather,
/// reduce-scatter, state gather, in that order); h.id a layer of `layout`, named as state_dict()
/// names it (another rank's header may hold any id: out of range, it is shown as "#id").
inline std::string describe_layer_collective(const CollectiveHeader& h, const LayerLayout& layout) {
  static const char* what[] = {
      "the all-gather of layer %s for its forward", "the all-gather of layer %s for its backward",
      "the reduce-scatter of layer %s's gradient", "the all-gather of layer %s for a checkpoint"};
  const std::string layer =
      h.id < layout.layers.size() ? layout.layers[h.id]->name() : "#" + std::to_string(h.id);
  char out[192];
  const int n = std::snprintf(out, sizeof out, "ZeRO-3 collective #%u is ", h.seq);
  std::snprintf(out + n, sizeof out - n,
                h.kind < 4 ? what[h.kind] : "an unknown collective on layer %s", layer.c_str());
  return std::string(out) + " (" + std::to_string(h.size) + " elements)";
}

/// The desync check of a ZeRO-3 engine's queue (common/comm/comm_queue.hpp runs it right before
/// each collective): on, always, and counted as the operation "desync_check" (part of this
/// chapter's traffic); each header is (seq, layer, Zero3 kind, P_l), described by
/// describe_layer_collective. `layout` must outlive the queue. World size 1: nothing to check.
inline CollectiveSequence desync_check(const LayerLayout& layout) {
  return CollectiveSequence(
      /*enabled=*/true, "desync_check",
      [&layout](const CollectiveHeader& h) { return describe_layer_collective(h, layout); },
      "Every rank must run the same layers in the same order: a layer run on some ranks only (a "
      "branch on one rank's data, a layer called twice) pairs different collectives across "
      "ranks, a hang or silently wrong weights");
}

}  // namespace ringzero
