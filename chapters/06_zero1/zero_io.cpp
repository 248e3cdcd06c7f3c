// ZeRO-1's members that are not the lesson: what it reports (the exact model-state bytes and
// the ledger's formula line), what it saves (--save-optimizer-state, checkpoints) and what the
// tests check (the padding stays zero). zero.hpp declares them.
// Leaves out: everything the training step does (zero.hpp).
#include <map>
#include <string>
#include <vector>

#include "chapters/06_zero1/optimizer_state.hpp"
#include "chapters/06_zero1/zero.hpp"

namespace ringzero {

/// 4 per element of the padded parameters and of the padded gradients (Ψ + padding each), 8
/// per real element of the rank's shard (AdamW): one entry per rank. In 16 bits: 2 + 2 per
/// padded element, 12 per real shard element (fp32 master, exp_avg, exp_avg_sq).
std::vector<int64_t> Zero1::model_states_bytes() const {
  const StateBytes b = mixed_ ? kMixedPrecisionAdam : states_;
  std::vector<int64_t> bytes;
  for (int r = 0; r < comm_.world_size(); ++r)
    bytes.push_back(static_cast<int64_t>(b.param + b.grad) * layout_.padded_total +
                    static_cast<int64_t>(b.optimizer) * shard_real_of(layout_, r));
  return bytes;
}

std::string Zero1::ledger_formula() const {
  if (mixed_) {  // 16 bits: kMixedPrecisionAdam's p = g = 2, K = 12
    const StateBytes b = kMixedPrecisionAdam;
    const ModelStateBytes f =
        zero_model_state_bytes(1, static_cast<double>(psi_), comm_.world_size(), b);
    std::string exact;
    for (int64_t x : model_states_bytes()) exact += (exact.empty() ? "" : ", ") + std::to_string(x);
    return "formula (ZeRO-1, " + std::string(dtype_name(mixed_->dtype())) +
           " + AdamW with fp32 master weights): " + zero_formula_text(1, b) + " = " +
           human_bytes(f.total()) + " per rank (DDP: " + full_copy_formula_text(b) + " = " +
           human_bytes(b.per_param() * static_cast<double>(psi_)) + "); exactly, with padding " +
           std::to_string(layout_.padding_total) +
           ": 2(Ψ + padding) + 2(Ψ + padding) + 12·(real shard) = " + exact +
           " B on ranks 0..N-1; plus one layer's fp32 working copy and gradient scratch "
           "(activations)";
  }
  const ModelStateBytes f =
      zero_model_state_bytes(1, static_cast<double>(psi_), comm_.world_size(), states_);
  std::string exact;
  for (int64_t b : model_states_bytes()) exact += (exact.empty() ? "" : ", ") + std::to_string(b);
  const int k = static_cast<int>(states_.optimizer);
  return "formula (ZeRO-1, " + std::string(states_.name) + "): " + zero_formula_text(1, states_) +
         " = " + human_bytes(f.total()) + " per rank (DDP: " + full_copy_formula_text(states_) +
         " = " + human_bytes(states_.per_param() * static_cast<double>(psi_)) +
         "); exactly, with padding " + std::to_string(layout_.padding_total) +
         ": 4(Ψ + padding) + 4(Ψ + padding) + " + std::to_string(k) + "·(real shard) = " + exact +
         " B on ranks 0..N-1";
}

/// optimizer_state.hpp's gather_optimizer_state. Errors: --optimizer is not adamw.
std::map<std::string, NamedTensor> Zero1::optimizer_state_dict() {
  if (mixed_) return mixed_->optimizer_state_dict(comm_, model_, layout_);  // 16 bits
  return gather_optimizer_state(comm_, model_, layout_, optimizers_);
}

/// Counts the parameters' and the gradients' padding elements that are not zero.
int64_t Zero1::nonzero_padding() const {
  int64_t count = 0;
  for (const BucketShard& s : layout_.buckets)
    for (int64_t i = s.padded_offset + s.size; i < s.padded_offset + s.padded_size(); ++i)
      count += mixed_ ? (params16_.span()[i] != 0) + (grads16_.span()[i] != 0)
                      : (params_.span()[i] != 0.0f) + (grads_.span()[i] != 0.0f);
  return count;
}

TrainingState Zero1::training_state() {
  RZ_CHECK(!mixed_, "checkpoints of a 16-bit run are not saved yet; use --precision fp32");
  TrainingState state;
  state.model = &model_;
  state.sharded = true;
  state.params_replicated = true;  // params_ holds every parameter on every rank
  state.chapter = "06_zero1";
  state.zero_stage = 6;
  state.layout = {{"kind", "buckets"}, {"padding_total", layout_.padding_total}};
  for (size_t b = 0; b < layout_.buckets.size(); ++b) {
    const BucketShard& s = layout_.buckets[b];
    state.layout["buckets"].push_back({{"offset", s.offset},
                                       {"size", s.size},
                                       {"padding", s.padding},
                                       {"padded_offset", s.padded_offset},
                                       {"shard_size", s.shard_size}});
    state.pieces.push_back({shard_params(b), s.offset + comm_.rank() * s.shard_size,
                            &optimizers_[b], s.segment_params});
  }
  return state;
}

}  // namespace ringzero
