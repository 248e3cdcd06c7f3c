// The AdamW state of a bucketed ZeRO (chapters 06-07) gathered whole, named as PyTorch's
// optimizer state is named per parameter (--save-optimizer-state, the equivalence tests).
// Leaves out: chapter 08's per-layer gather (its zero_io.cpp), checkpoints
// (common/checkpoint.hpp, common/shard_state.hpp).
#pragma once

#include <algorithm>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "chapters/04_ring_allreduce/ring.hpp"
#include "chapters/06_zero1/shard.hpp"
#include "common/comm.hpp"
#include "common/ledger.hpp"
#include "common/nn.hpp"
#include "common/optim.hpp"
#include "common/safetensors.hpp"
#include "common/shard_precision.hpp"

namespace ringzero {

/// Collective: per-bucket fp32 states of this rank's real shard elements gathered into the
/// unpadded names and shapes, "<param><suffix>" for each of `suffixes`, state_of(b, which)
/// giving bucket b's state number `which` (the real shard elements, in order). With steps_of
/// (b -> the bucket's per-segment step counts), also "<param>.step" (shape (1)). Every state
/// is one ring all-gather per bucket over a (Ψ + padding) fp32 buffer (counted by the comm
/// counters). Errors: pieces of a parameter whose step counts differ.
template <class StateOf, class StepsOf>
std::map<std::string, NamedTensor> gather_shard_states(Communicator& comm, const Model& model,
                                                       const ShardLayout& layout,
                                                       const std::vector<std::string>& suffixes,
                                                       StateOf state_of, StepsOf steps_of) {
  const auto& params = model.parameters();
  std::map<std::string, NamedTensor> out;
  std::vector<double> steps(3 * params.size(), 0.0);  // (P, 3) Σ step, Σ step², pieces
  for (size_t which = 0; which < suffixes.size(); ++which) {
    Buffer full(layout.padded_total, MemTag::comm_buffers);  // (Ψ + padding) the state, gathered
    for (size_t b = 0; b < layout.buckets.size(); ++b) {
      const BucketShard& s = layout.buckets[b];
      std::span<const float> state = state_of(b, which);
      std::copy(state.begin(), state.end(),
                full.data() + s.padded_offset + comm.rank() * s.shard_size);
      ring_all_gather(comm, full.span().subspan(s.padded_offset, s.padded_size()));
      const std::vector<int64_t>* seg_steps = steps_of(b);
      for (size_t k = 0; which == 0 && seg_steps && k < seg_steps->size(); ++k) {
        const auto t = static_cast<double>((*seg_steps)[k]);
        double* st = &steps[3 * s.segment_params[k]];
        st[0] += t, st[1] += t * t, st[2] += 1;
      }
    }
    for (size_t i = 0; i < params.size(); ++i) {
      const float* v = full.data() + layout.param_offset[i];
      out[params[i]->name() + suffixes[which]] = {params[i]->shape(), {v, v + params[i]->numel()}};
    }
  }
  if (!steps_of(0)) return out;  // no step counts (e.g. master weights)
  comm.all_reduce_metrics(steps);
  for (size_t i = 0; i < params.size(); ++i) {
    const double* st = &steps[3 * i];
    RZ_CHECK(st[1] * st[2] == st[0] * st[0],
             "the pieces of " << params[i]->name() << " took different numbers of steps");
    out[params[i]->name() + ".step"] = {{1}, {static_cast<float>(st[0] / st[2])}};
  }
  return out;
}

/// Collective, for the equivalence tests and --save-optimizer-state (the comm counters count
/// its traffic): the AdamW state of `optimizer` (unit b: this rank's real elements of bucket b;
/// in 16 bits the masters' moments) gathered into the unpadded names and shapes, as
/// "<param>.exp_avg", "<param>.exp_avg_sq" and "<param>.step" (shape (1)). Errors: --optimizer
/// sgd; pieces of a parameter whose step counts differ.
inline std::map<std::string, NamedTensor> gather_optimizer_state(Communicator& comm,
                                                                 const Model& model,
                                                                 const ShardLayout& layout,
                                                                 const ShardOptimizer& optimizer) {
  return gather_shard_states(
      comm, model, layout, {".exp_avg", ".exp_avg_sq"},
      [&](size_t b, size_t which) {
        return which == 0 ? optimizer.exp_avg(b) : optimizer.exp_avg_sq(b);
      },
      [&](size_t b) { return &optimizer.segment_steps(b); });
}

/// Collective, --save-final in 16 bits: the fp32 master weights of `optimizer` gathered whole
/// under the model's state_dict() names. Errors: an fp32 run (its parameters are the state).
inline std::map<std::string, NamedTensor> gather_master_weights(Communicator& comm,
                                                                const Model& model,
                                                                const ShardLayout& layout,
                                                                const ShardOptimizer& optimizer) {
  return gather_shard_states(
      comm, model, layout, {""}, [&](size_t b, size_t) { return optimizer.master(b); },
      [](size_t) { return static_cast<const std::vector<int64_t>*>(nullptr); });
}

}  // namespace ringzero
