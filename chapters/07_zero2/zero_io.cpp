// ZeRO-2's members that are not the lesson: what it reports (the exact model-state bytes, the
// buckets in flight and the ledger's formula line) and describe(), declared in zero.hpp; the
// engine's instantiations.
// Leaves out: everything the training step does (zero.hpp); what it saves (--save-final,
// --save-optimizer-state, checkpoints: derived from describe() in common/zero/shard_state.hpp).
#include <algorithm>
#include <string>
#include <vector>

#include "chapters/07_zero2/zero.hpp"

namespace ringzero {

/// Between steps: p per element of the padded parameters (Ψ + padding), sizeof(R) per element
/// of the rank's gradient shard (Σ s), K per real element of its shard; one entry per rank.
/// During backward, the buckets in flight come on top (in_flight_peak_bytes()). fp32: 4, 4 and
/// K of --optimizer (AdamW 8); 16 bits: 2, 2 (4 with --reduce-dtype fp32) and 12 (fp32 master,
/// exp_avg, exp_avg_sq).
template <Element T, Element R>
std::vector<int64_t> Zero2<T, R>::model_states_bytes() const {
  const StateBytes b = optimizer_.state_bytes();
  std::vector<int64_t> bytes;
  for (int r = 0; r < comm_.world_size(); ++r)
    bytes.push_back(static_cast<int64_t>(b.param) * layout_.padded_total +
                    static_cast<int64_t>(element_bytes<R>()) * layout_.shard_total +
                    static_cast<int64_t>(b.optimizer) * shard_real_of(layout_, r));
  return bytes;
}

/// With one micro-step per optimizer step: the largest two consecutive buckets (padded, of T),
/// or the only one.
template <Element T, Element R>
int64_t Zero2<T, R>::in_flight_peak_bytes() const {
  const int64_t g = element_bytes<T>();  // bytes per gradient element
  int64_t most = g * layout_.buckets[0].padded_size();
  for (size_t b = 1; b < layout_.buckets.size(); ++b)
    most = std::max(most,
                    g * (layout_.buckets[b - 1].padded_size() + layout_.buckets[b].padded_size()));
  return most;
}

template <Element T, Element R>
std::string Zero2<T, R>::ledger_formula() const {
  StateBytes b = optimizer_.state_bytes();
  b.grad = element_bytes<R>();  // the gradient shard holds the reduce dtype
  const bool fp32 = std::is_same_v<T, float>;
  return zero_ledger_formula(
      {.stage = 2, .states = zero_states_name<T>(b), .b = b, .psi = psi_,
       .world_size = comm_.world_size(), .padding = layout_.padding_total,
       .terms = std::to_string(static_cast<int>(b.param)) + "(Ψ + padding) + " +
                std::to_string(element_bytes<R>()) + "·(shard) + " +
                std::to_string(static_cast<int>(b.optimizer)) + "·(real shard)",
       .exact = model_states_bytes(),
       .extra = std::string(", + at most two ") + (fp32 ? "" : "16-bit ") +
                "buckets in flight = " + human_bytes(static_cast<double>(in_flight_peak_bytes())),
       .tail = " between steps, + " + std::to_string(in_flight_peak_bytes()) +
               " B in flight at the peak " +
               (fp32 ? "(K = 1; with K > 1 every bucket stays through accumulation)" : "(K = 1)") +
               zero_states_note<T>()});
}

template <Element T, Element R>
EngineDescription Zero2<T, R>::describe() const {
  EngineDescription d = Zero1<T, R>::describe();  // the buckets, their shards, the collectives
  d.zero_stage = 2;
  d.max_in_flight = 2;  // at most two buckets exist at once (zero.hpp)
  d.in_flight_peak_bytes = in_flight_peak_bytes();
  return d;
}

RINGZERO_INSTANTIATE_PRECISIONS(Zero2);  // common/precision/with_precision.hpp

}  // namespace ringzero
