// Layer shards: ZeRO-3's unit of gathering is a layer, so its layout is padded per layer.
//
// A Linear's weight and bias are consecutive in the model's flat layout (nn.hpp), so a layer
// is one range of Ψ_l elements: a bucket of chapter 06's padded layout (shard.hpp), unchanged.
// Padded with zeros to P_l = N·s_l, s_l = ceil(Ψ_l / N), rank r owns [r s_l, (r+1) s_l) of it:
// chunk r of chapter 04's ring, so the ring's reduce-scatter leaves each rank the sum of exactly
// its shard and its all-gather rebuilds the layer. A rank's shard buffers hold its shard of
// every layer, in layer order: Σ s_l ≈ Ψ/N elements; the padding stays zero (shard.hpp).
// Why per layer, not per bucket as chapters 06-07: a layer is what one forward or backward
// needs at once. The price: for N > 2 the ring sums an element of a layer in the order of its
// chunk within the layer, not within chapter 07's bucket, so the two are bitwise equal only
// where buckets and layers coincide (and for N ≤ 2, where a sum of two is commutative).
// Leaves out: grouping small layers into one unit (FSDP's auto-wrap policy).
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "chapters/06_zero1/shard.hpp"
#include "common/comm/collectives.hpp"
#include "common/core/check.hpp"
#include "common/core/nn.hpp"
#include "common/report/dist.hpp"

namespace ringzero {

/// ZeRO-3's layout: chapter 06's (shard.hpp) with one bucket per Linear layer, in forward order
/// (`buckets[l]`: layer l's range, Ψ_l, P_l, s_l, this rank's shard); and the layers themselves.
/// (Its padded_total and offsets place a whole padded buffer, which ZeRO-3 never allocates.)
struct LayerLayout : ShardLayout {
  std::vector<Linear*> layers;  ///< (L) layer l owns buckets[l]
};

/// The layers of `model` cut into shards, for `rank` of `world_size`.
/// Errors: a Linear whose weight and bias are not consecutive parameters.
inline LayerLayout plan_layer_shards(const Model& model, int rank, int world_size) {
  const auto& params = model.parameters();
  std::vector<Bucket> one_per_layer;
  for (Linear* layer : model.linear_layers()) {
    const int w = model.parameter_index(layer->weight);
    RZ_CHECK(w + 1 < std::ssize(params) && params[w + 1] == &layer->bias,
             "layer " << layer->name() << ": weight and bias must be consecutive parameters");
    one_per_layer.push_back({.offset = model.offsets()[w],
                             .size = layer->weight.numel() + layer->bias.numel(),
                             .params = {w + 1, w}});  // as chapter 05's: launch order, bias first
  }
  return {plan_shards(model, one_per_layer, rank, world_size), model.linear_layers()};
}

/// Bytes of full layers in flight at the worst moment of a step (the ledger's comm_buffers,
/// besides the ring's one-chunk scratch). Without prefetch: one layer's parameters and its
/// gradient, 8·max P_l. With prefetch, during layer l's backward: its parameters and gradient,
/// the parameters of l−1 already gathering and the gradient of l+1 still reduce-scattering,
/// 4·max(P_{l−1} + 2 P_l + P_{l+1}) (the forward holds only P_l + P_{l+1}). In 16 bits the
/// computing layer's parameters and gradient are fp32 still, the layers on the wire 16-bit
/// (gather_bytes = 2; reduce_bytes = 2, or 4 with --reduce-dtype fp32): with prefetch
/// max(gather_bytes·P_{l−1} + 8 P_l + reduce_bytes·P_{l+1}), 8·max P_l without.
inline int64_t in_flight_peak_bytes(const LayerLayout& layout, bool prefetch,
                                    int64_t gather_bytes = 4, int64_t reduce_bytes = 4) {
  const auto& L = layout.buckets;
  // P_l, and 0 past either end (l = −1 wraps)
  auto P = [&](size_t l) { return l < L.size() ? L[l].padded_size() : int64_t{0}; };
  int64_t peak = 0;
  for (size_t l = 0; l < L.size(); ++l)
    peak = std::max(
        peak, prefetch ? gather_bytes * P(l - 1) + 8 * P(l) + reduce_bytes * P(l + 1) : 8 * P(l));
  return peak;
}

/// Bytes each rank sends and receives per optimizer step: per micro-step, per layer, chapter
/// 06's reduce-scatter and all-gather (zero_traffic_theory, shard.hpp) and one more
/// all-gather (the same function with 0 gradient bytes), since forward and backward each gather
/// the layer: 3(N−1)/N·4(Ψ + padding) bytes in fp32, 1.5× DDP's 2(N−1)/N·4Ψ; plus a 16-byte
/// desync header per collective (layer_check.hpp), 48 L. Bytes per element: gather_bytes for the
/// all-gathers, reduce_bytes for the reduce-scatter: 4 and 4 in fp32; in 16 bits 2 and 2, or 2
/// and 4 with --reduce-dtype fp32. With MPI's collectives the counters see the payload handed to
/// MPI, as in chapter 06; the text line is derived from the description (zero_lesson.hpp).
inline TrafficTheory zero3_traffic_theory(const LayerLayout& layout, int world_size,
                                          int64_t grad_accum_steps, Collectives collectives,
                                          int gather_bytes = 4, int reduce_bytes = 4) {
  TrafficTheory theory =
      zero_traffic_theory(layout, world_size, collectives, reduce_bytes, gather_bytes);
  const TrafficTheory extra = zero_traffic_theory(layout, world_size, collectives, 0, gather_bytes);
  const int64_t headers = world_size > 1 ? 3 * 16 * std::ssize(layout.layers) : 0;
  for (int r = 0; r < world_size; ++r) {
    theory.bytes_sent[r] =
        grad_accum_steps * (theory.bytes_sent[r] + extra.bytes_sent[r] + headers);
    theory.bytes_received[r] =
        grad_accum_steps * (theory.bytes_received[r] + extra.bytes_received[r] + headers);
  }
  return theory;
}

}  // namespace ringzero
