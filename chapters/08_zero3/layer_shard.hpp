// Layer shards: ZeRO-3's unit of gathering is a layer, so its layout is padded per layer.
//
// A Linear's weight and bias are consecutive in the model's flat layout (nn.hpp), so a layer
// is one range of Ψ_l elements. It is padded with zeros to P_l = N·s_l, s_l = ceil(Ψ_l / N), and
// rank r owns [r s_l, (r+1) s_l) of it: chunk r of chapter 04's ring, so the ring's
// reduce-scatter leaves each rank the sum of exactly its shard and its all-gather rebuilds the
// layer (here N = 3, a layer of 7 elements: s 3, padding 2):
//
//   padded layer    | w0 w1 w2 | w3 w4 b0 | b1 0  0 |     rank 2 owns one real element
//   owner           |  rank 0  |  rank 1  | rank 2  |     and two of padding
//
// A rank's shard buffers hold its shard of every layer, in layer order: Σ s_l ≈ Ψ/N elements.
// The padding is allocated zero and nothing ever writes it (the optimizer gets only the real
// elements; a reduce-scatter adds zeros to zeros), so it adds nothing to norms. A layer smaller
// than N leaves some ranks only padding; they still join every collective.
// Why per layer, not per bucket as chapters 06-07: a layer is what one forward or backward
// needs at once. The price: for N > 2 the ring sums an element of a layer in the order of its
// chunk within the layer, not within chapter 07's bucket, so the two are bitwise equal only
// where buckets and layers coincide (and for N ≤ 2, where a sum of two is commutative).
// Leaves out: grouping small layers into one unit (FSDP's auto-wrap policy).
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <string>
#include <tuple>
#include <vector>

#include "chapters/04_ring_allreduce/ring.hpp"
#include "common/collectives.hpp"
#include "common/dist.hpp"
#include "common/metrics.hpp"
#include "common/nn.hpp"

namespace ringzero {

/// One Linear layer as a range of the model's flat layout, and a rank's shard of it.
struct LayerShard {
  Linear* layer = nullptr;
  int64_t offset = 0;        ///< its first element (weight[0]) in the model's unpadded layout
  int64_t weight_numel = 0;  ///< out · in; the bias follows
  int64_t numel = 0;         ///< Ψ_l, weight + bias
  int64_t shard_size = 0;    ///< s_l = ceil(Ψ_l / N), the same on every rank
  int64_t padded_size = 0;   ///< P_l = N s_l
  int64_t shard_offset =
      0;             ///< this layer's shard in a rank's shard buffers (Σ s of earlier layers)
  int64_t real = 0;  ///< real elements of this rank's shard: clamp(Ψ_l − r s_l, 0, s_l)
  std::vector<int64_t> segments;           ///< sizes of the weight and bias pieces among them
  std::vector<Parameter*> segment_params;  ///< the parameter of each segment
};

struct LayerLayout {
  std::vector<LayerShard> layers;  ///< forward order
  int64_t shard_total = 0;         ///< Σ s_l, elements of each rank's shard buffers
  int64_t shard_real = 0;          ///< Σ real (Σ over ranks = Ψ)
};

/// The layers of `model` cut into shards, for `rank` of `world_size`.
/// Errors: a Linear whose weight and bias are not consecutive parameters.
inline LayerLayout plan_layer_shards(const Model& model, int rank, int world_size) {
  LayerLayout layout;
  const auto& params = model.parameters();
  for (Linear* layer : model.linear_layers()) {
    const auto w = static_cast<size_t>(std::find(params.begin(), params.end(), &layer->weight) -
                                       params.begin());
    RZ_CHECK(w + 1 < params.size() && params[w + 1] == &layer->bias,
             "layer " << layer->name() << ": weight and bias must be consecutive parameters");
    LayerShard s;
    s.layer = layer;
    s.offset = model.offsets()[w];
    s.weight_numel = layer->weight.numel();
    s.numel = s.weight_numel + layer->bias.numel();
    s.shard_size = ring_chunk(s.numel, world_size, 0).size;
    s.padded_size = s.shard_size * world_size;
    s.shard_offset = layout.shard_total;
    s.real = std::clamp(s.numel - rank * s.shard_size, int64_t{0}, s.shard_size);
    const int64_t lo = rank * s.shard_size,
                  hi = lo + s.real;  // this rank's real elements, layer-local
    for (auto [p, begin, end] : {std::tuple{&layer->weight, int64_t{0}, s.weight_numel},
                                 std::tuple{&layer->bias, s.weight_numel, s.numel}})
      if (std::max(begin, lo) < std::min(end, hi)) {
        s.segments.push_back(std::min(end, hi) - std::max(begin, lo));
        s.segment_params.push_back(p);
      }
    layout.shard_total += s.shard_size;
    layout.shard_real += s.real;
    layout.layers.push_back(std::move(s));
  }
  return layout;
}

/// The --explain-layers table: one line per layer, in forward order.
inline std::string explain_layer_shards(const LayerLayout& layout, int world_size) {
  char line[256];
  std::snprintf(
      line, sizeof line,
      "layer plan: %zu layers, each padded to a multiple of N = %d and cut into N shards:\n",
      layout.layers.size(), world_size);
  std::string out = line;
  for (const LayerShard& s : layout.layers) {
    std::snprintf(
        line, sizeof line,
        "  layer %-4s | %10lld elements | padding %2lld | shard %9lld elements (%s) | %s, %s\n",
        s.layer->name().c_str(), static_cast<long long>(s.numel),
        static_cast<long long>(s.padded_size - s.numel), static_cast<long long>(s.shard_size),
        human_bytes(4.0 * s.shard_size).c_str(), s.layer->weight.name().c_str(),
        s.layer->bias.name().c_str());
    out += line;
  }
  return out;
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
  const auto& L = layout.layers;
  auto P = [&](size_t l) {
    return l < L.size() ? L[l].padded_size : int64_t{0};
  };  // l = −1 wraps: 0
  int64_t peak = 0;
  for (size_t l = 0; l < L.size(); ++l)
    peak = std::max(
        peak, prefetch ? gather_bytes * P(l - 1) + 8 * P(l) + reduce_bytes * P(l + 1) : 8 * P(l));
  return peak;
}

/// Bytes each rank sends and receives per optimizer step: per micro-step, per layer, two ring
/// all-gathers of its parameters (forward and backward) and one ring reduce-scatter of its
/// gradient, (N − 1) s_l elements each, plus a 16-byte desync header per collective (zero3.hpp):
/// 3(N−1)/N·4(Ψ + padding) + 48 L bytes per micro-step, 1.5× DDP's 2(N−1)/N·4Ψ. With MPI's
/// collectives the counters see the payload handed to MPI: s_l sent and (N − 1) s_l received
/// per all-gather, the reverse per reduce-scatter. Bytes per element: gather_bytes for the
/// all-gathers, reduce_bytes for the reduce-scatter: 4 and 4 in fp32; in 16 bits 2 and 2
/// (3(N−1)/N·2(Ψ + padding)), or 2 and 4 with --reduce-dtype fp32.
inline TrafficTheory zero3_traffic_theory(const LayerLayout& layout, int world_size, int64_t psi,
                                          int64_t grad_accum_steps, Collectives collectives,
                                          int64_t gather_bytes = 4, int64_t reduce_bytes = 4) {
  const bool ring = collectives == Collectives::ring;
  const int64_t N = world_size, L = static_cast<int64_t>(layout.layers.size());
  const int64_t g = gather_bytes, r = reduce_bytes;
  int64_t sent = 0,
          received = 0;  // bytes per micro-step, the same on every rank (every chunk is s_l)
  for (const LayerShard& s : layout.layers) {
    sent += ring ? (N - 1) * s.shard_size * (2 * g + r) : (2 * g + (N - 1) * r) * s.shard_size;
    received += ring ? (N - 1) * s.shard_size * (2 * g + r) : (2 * (N - 1) * g + r) * s.shard_size;
  }
  const int64_t headers = N > 1 ? 3 * L * 16 : 0, bytes = grad_accum_steps * (sent + headers);
  TrafficTheory theory;
  theory.bytes_sent.assign(static_cast<size_t>(N), bytes);
  theory.bytes_received.assign(static_cast<size_t>(N), grad_accum_steps * (received + headers));
  const double n = static_cast<double>(N), p = static_cast<double>(psi);
  const std::string per_param =
      g == r ? "3(N-1)/N·" + std::to_string(g) + "Ψ"
             : "(N-1)/N·(2·" + std::to_string(g) + " + " + std::to_string(r) + ")Ψ";
  theory.formula =
      (ring
           ? "theory (ZeRO-3: per micro-step and layer, all-gather forward + all-gather backward "
             "+ reduce-scatter): every rank sends " +
                 per_param + " = " + human_bytes((n - 1) / n * static_cast<double>(2 * g + r) * p) +
                 " per micro-step" +
                 (g == r ? ", 1.5x DDP's 2(N-1)/N·" + std::to_string(g) +
                               "Ψ = " + human_bytes(2 * (n - 1) / n * static_cast<double>(g) * p)
                         : std::string())
           : std::string("MPI_Allgather x 2 + MPI_Reduce_scatter_block per layer: counters show "
                         "the payload handed "
                         "to MPI, not its wire traffic")) +
      "; exactly (padding, 16-byte desync headers, K = " + std::to_string(grad_accum_steps) +
      " micro-steps): " + human_bytes(static_cast<double>(bytes)) + "; N = " + std::to_string(N) +
      ", Ψ = " + std::to_string(psi) +
      ", padding = " + std::to_string(N * layout.shard_total - psi) + ", L = " + std::to_string(L) +
      " layers";
  return theory;
}

}  // namespace ringzero
