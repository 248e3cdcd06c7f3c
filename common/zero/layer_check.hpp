// layer_check: the names and the desync check of collectives that work on layers (chapter 08's
// ZeRO-3, one all-gather per layer per forward and backward, one reduce-scatter per backward),
// written beside chapters 05-07's bucket ones (common/checks/collective_check.hpp's
// describe_bucket, common/comm/comm_queue.hpp's bucket_naming).
//
// Why on always for layers: ZeRO-3 makes a collective per layer, per forward and per backward,
// so a rank that runs one layer more than the others (a branch on its own data, a layer called
// twice) posts one collective more; paired with another rank's collective of another layer,
// that is a hang or, for two layers of the same size, silently wrong weights. The check's 16
// bytes per collective (collective_check.hpp: sequence number, layer, kind, size, swapped with
// the ring neighbours) are counted as "desync_check", part of the chapter's traffic.
// Provides: LayerCollective, describe_layer_collective, layer_desync_check, layer_naming.
// Leaves out: the collectives and when they run (chapters/08_zero3); divergences that post the
// same collectives (a rank that skips a layer's compute but not its hooks computes garbage, in
// step).
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "common/checks/collective_check.hpp"
#include "common/comm/comm_queue.hpp"
#include "common/core/nn.hpp"

namespace ringzero {

/// What a layer's collective is for; part of the desync header.
enum LayerCollective : uint32_t { kForwardGather, kBackwardGather, kReduceScatter, kStateGather };

/// A desync header in words, e.g. "ZeRO-3 collective #9 is the all-gather of layer 2 for its
/// forward (1234 elements)". h.kind is a LayerCollective; h.id an index into `layers`, named as
/// state_dict() names it (another rank's header may hold any id: out of range, shown as "#id").
inline std::string describe_layer_collective(const CollectiveHeader& h,
                                             const std::vector<Linear*>& layers) {
  static const char* what[] = {
      "the all-gather of layer %s for its forward", "the all-gather of layer %s for its backward",
      "the reduce-scatter of layer %s's gradient", "the all-gather of layer %s for a checkpoint"};
  const std::string layer =
      h.id < layers.size() ? layers[h.id]->name() : "#" + std::to_string(h.id);
  char out[192];
  const int n = std::snprintf(out, sizeof out, "ZeRO-3 collective #%u is ", h.seq);
  std::snprintf(out + n, sizeof out - n,
                h.kind < 4 ? what[h.kind] : "an unknown collective on layer %s", layer.c_str());
  return std::string(out) + " (" + std::to_string(h.size) + " elements)";
}

/// The desync check of a queue of layer collectives (common/comm/comm_queue.hpp runs it right
/// before each one): on, always, counted as "desync_check"; each header is (seq, layer,
/// LayerCollective, P_l), described by describe_layer_collective. `layers` must outlive the queue.
/// World size 1: nothing to check.
inline CollectiveSequence layer_desync_check(const std::vector<Linear*>& layers) {
  return CollectiveSequence(
      /*enabled=*/true, "desync_check",
      [&layers](const CollectiveHeader& h) { return describe_layer_collective(h, layers); },
      "Every rank must run the same layers in the same order: a layer run on some ranks only (a "
      "branch on one rank's data, a layer called twice) pairs different collectives across "
      "ranks, a hang or silently wrong weights");
}

/// How the trace names layer collectives: "all_gather 2 (forward)", "reduce_scatter 4",
/// posted as "post all_gather 2 (forward)", category "zero3". `layers` must outlive the queue.
inline CommQueue::Naming layer_naming(const std::vector<Linear*>& layers) {
  return {[&layers](uint32_t kind, int l) {
            static const char* labels[] = {"all_gather %s (forward)", "all_gather %s (backward)",
                                           "reduce_scatter %s", "all_gather %s (state)"};
            char label[96];
            std::snprintf(label, sizeof label, labels[kind % 4], layers[l]->name().c_str());
            return std::string(label);
          },
          "post", "zero3"};
}

}  // namespace ringzero
