// ZeRO-3's members that are not the lesson: what it is (describe()), what it reports (the
// model-state bytes, the traffic theory and the ledger's formula line) and how a state is
// gathered whole (one layer at a time). zero3.hpp declares them.
// Leaves out: everything the training step does (zero3.hpp); what it saves (--save-final,
// --save-optimizer-state, checkpoints: derived from describe() in common/zero/shard_state.hpp).
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "chapters/08_zero3/zero3.hpp"

namespace ringzero {

/// p per element of the parameter shard, sizeof(R) per element of the gradient shard (Σ s_l
/// each, padding included), the paper's K per real element (optimizer bytes): fp32 4 + 4 + K of
/// --optimizer; 16 bits 2 + 2 (4 with --reduce-dtype fp32) + 12 (master, exp_avg, exp_avg_sq).
template <Element T, Element R>
std::vector<int64_t> Zero3<T, R>::model_states_bytes() const {
  const StateBytes b = optimizer_.state_bytes();
  std::vector<int64_t> bytes;
  for (int r = 0; r < comm_.world_size(); ++r)
    bytes.push_back(static_cast<int64_t>(b.param) * layout_.shard_total +
                    static_cast<int64_t>(element_bytes<R>()) * layout_.shard_total +
                    static_cast<int64_t>(b.optimizer) * shard_real_of(layout_, r));
  return bytes;
}

template <Element T, Element R>
TrafficTheory Zero3<T, R>::traffic_theory() const {
  return zero3_traffic_theory(layout_, comm_.world_size(), grad_accum_steps_, options_.collectives,
                              element_bytes<T>(), element_bytes<R>());
}

template <Element T, Element R>
EngineDescription Zero3<T, R>::describe() const {
  std::vector<int64_t> sizes;  // P_l per layer, in forward order (the cost model replays them)
  for (const BucketShard& s : layout_.buckets) sizes.push_back(s.padded_size());
  return {.zero_stage = 3,
          .unit = "layers",
          .unit_sizes = std::move(sizes),
          .collectives = options_.collectives,
          .prefetch = options_.prefetch,
          .world_size = comm_.world_size(),
          .units = shard_units(layout_),
          .padding = layout_.padding_total,
          .in_flight_peak_bytes = in_flight_peak_bytes(),
          .collective_forward = true};  // every forward gathers each layer
}

template <Element T, Element R>
std::string Zero3<T, R>::ledger_formula() const {
  StateBytes b = optimizer_.state_bytes();
  b.grad = element_bytes<R>();  // the gradient shard holds the reduce dtype
  return zero_ledger_formula(
      {.stage = 3, .states = b.name, .b = b, .psi = psi_, .world_size = comm_.world_size(),
       .padding = layout_.padding_total,
       .terms = std::to_string(static_cast<int>(b.param)) + "Σs_l + " +
                std::to_string(element_bytes<R>()) + "Σs_l + " +
                std::to_string(static_cast<int>(b.optimizer)) + "·(real shard)",
       .exact = model_states_bytes(),
       .tail = std::string("; comm_buffers at the peak: full layers in flight ") +
               (!options_.prefetch ? "8·max P_l = "
                : std::is_same_v<T, float>
                    ? "4·max(P_l-1 + 2P_l + P_l+1) = "
                    : "max(" + std::to_string(element_bytes<T>()) + "P_l-1 + 8P_l + " +
                          std::to_string(element_bytes<R>()) + "P_l+1) = ") +
               std::to_string(in_flight_peak_bytes()) + " B + one ring chunk " +
               std::to_string(collectives_.scratch_bytes()) + " B"});
}

// Each layer through layer_collectives.hpp as a kStateGather, behind the desync check.
template <Element T, Element R>
void Zero3<T, R>::gather_state(size_t l, std::span<float> layer) {
  collectives_.wait(collectives_.all_gather(static_cast<int>(l), kStateGather, layer));
}

RINGZERO_INSTANTIATE_PRECISIONS(Zero3);  // common/precision/with_precision.hpp

}  // namespace ringzero
