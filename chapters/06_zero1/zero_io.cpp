// ZeRO-1's members that are not the lesson: what it reports (the exact model-state bytes and
// the ledger's formula line), declared in zero.hpp; the engine's instantiations.
// Leaves out: everything the training step does (zero.hpp); what it saves (--save-final,
// --save-optimizer-state, checkpoints: derived from describe() in common/zero/shard_state.hpp).
#include <string>
#include <vector>

#include "chapters/06_zero1/zero.hpp"

namespace ringzero {

/// p + g per element of the padded parameters and of the padded gradients (Ψ + padding each),
/// K per real element of the rank's shard: one entry per rank. fp32 4 + 4 + K of --optimizer
/// (AdamW 8); 16 bits 2 + 2 + 12 (fp32 master, exp_avg, exp_avg_sq).
template <Element T, Element R>
std::vector<int64_t> Zero1<T, R>::model_states_bytes() const {
  const StateBytes b = optimizer_.state_bytes();
  std::vector<int64_t> bytes;
  for (int r = 0; r < comm_.world_size(); ++r)
    bytes.push_back(static_cast<int64_t>(b.param + b.grad) * layout_.padded_total +
                    static_cast<int64_t>(b.optimizer) * shard_real_of(layout_, r));
  return bytes;
}

template <Element T, Element R>
std::string Zero1<T, R>::ledger_formula() const {
  const StateBytes b = optimizer_.state_bytes();
  const std::string p = std::to_string(static_cast<int>(b.param)),
                    k = std::to_string(static_cast<int>(b.optimizer));
  return zero_ledger_formula({.stage = 1, .states = zero_states_name<T>(b), .b = b, .psi = psi_,
                              .world_size = comm_.world_size(), .padding = layout_.padding_total,
                              .terms = p + "(Ψ + padding) + " + p + "(Ψ + padding) + " + k +
                                       "·(real shard)",
                              .exact = model_states_bytes(), .tail = zero_states_note<T>()});
}

RINGZERO_INSTANTIATE_PRECISIONS(Zero1);  // common/precision/with_precision.hpp

}  // namespace ringzero
