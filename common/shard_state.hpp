// shard_state: the training state a checkpoint saves and loads for a sharded engine (ZeRO,
// chapters 06-08), derived from the engine's description (engine_description.hpp) once for
// every stage: which elements this rank holds, where they sit in the engine's parameter buffer,
// and the layout the manifest records.
//
// Where a unit's elements sit follows from the description alone. ZeRO-1/2 keep every
// parameter, each unit padded in place (chapter 06's shard.hpp: a unit starts at its offset
// plus the padding of the units below it in memory; rank r's shard r·s further on). ZeRO-3
// keeps only this rank's shard of every unit, one after the other in memory order (chapter
// 08's layer_shard.hpp).
// Leaves out: writing and reading the files (checkpoint.hpp); the optimizer's share of a piece
// (ShardOptimizer::state_piece).
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>
#include <type_traits>
#include <vector>

#include "checkpoint.hpp"
#include "engine_description.hpp"
#include "nn.hpp"
#include "shard_buffers.hpp"
#include "shard_precision.hpp"

namespace ringzero {

/// Where each unit of `d` (in its order) begins in a sharded engine's parameter buffer: the
/// padded unit (ZeRO-1/2) or this rank's shard of it (ZeRO-3); see the top.
inline std::vector<int64_t> unit_starts(const EngineDescription& d) {
  const int64_t N = d.world_size;
  std::vector<int64_t> starts;
  for (const ShardUnit& u : d.units) {
    int64_t below = 0;  // the padding (ZeRO-1/2) or the shards (ZeRO-3) of the units below u
    for (const ShardUnit& v : d.units)
      if (v.offset < u.offset) below += d.zero_stage < 3 ? N * v.shard_size - v.size : v.shard_size;
    starts.push_back(d.zero_stage < 3 ? u.offset + below : below);
  }
  return starts;
}

/// The real elements of `rank`'s shard of unit u: clamp(size − rank·s, 0, s).
inline int64_t shard_real(const ShardUnit& u, int rank) {
  return std::clamp(u.size - rank * u.shard_size, int64_t{0}, u.shard_size);
}

/// The parameters (indices, memory order) with elements in [begin, begin + n) of the model's
/// flat layout: the segments of a shard, as ShardOptimizer cuts them.
inline std::vector<int> params_in(const Model& model, int64_t begin, int64_t n) {
  std::vector<int> out;
  for (size_t i = 0; i < model.parameters().size(); ++i) {
    const int64_t b = model.offsets()[i], e = b + model.parameters()[i]->numel();
    if (std::max(b, begin) < std::min(e, begin + n)) out.push_back(static_cast<int>(i));
  }
  return out;
}

/// The training state common/checkpoint.hpp saves and loads for the sharded engine `d` on
/// `rank`: one piece per unit, this rank's real shard elements at their global offset and their
/// optimizer (ShardOptimizer::state_piece: in 16 bits the fp32 master weights and moments);
/// `params`, the engine's parameter buffer of T (every padded unit for ZeRO-1/2, this rank's
/// shards for ZeRO-3); the layout and padding for the manifest. In 16 bits loading rounds the
/// parameters this rank keeps from the checkpoint's fp32 values, as each step rounds the
/// masters. Errors: none here; the checkpointer checks what it reads.
template <Element T>
TrainingState sharded_training_state(const EngineDescription& d, Model& model, int rank,
                                     ShardOptimizer& optimizer, std::span<T> params) {
  const bool replicated = d.zero_stage < 3;  // ZeRO-1/2: every rank holds every parameter
  TrainingState state;
  state.model = &model;
  state.sharded = true;
  state.params_replicated = replicated;
  state.zero_stage = d.zero_stage;
  state.layout = {{"kind", d.unit}, {"padding_total", d.padding}};
  const std::vector<int64_t> starts = unit_starts(d);
  for (size_t u = 0; u < d.units.size(); ++u) {
    const ShardUnit& s = d.units[u];
    state.layout[d.unit].push_back({{"offset", s.offset},
                                    {"size", s.size},
                                    {"padding", d.world_size * s.shard_size - s.size},
                                    {"shard_size", s.shard_size}});
    const int64_t real = shard_real(s, rank), global = s.offset + rank * s.shard_size;
    std::span<float> shard;  // in 16 bits the piece holds the master weights instead
    if constexpr (std::is_same_v<T, float>)
      shard = params.subspan(starts[u] + (replicated ? rank * s.shard_size : 0), real);
    state.pieces.push_back(optimizer.state_piece(u, shard, global, params_in(model, global, real)));
  }
  state.scaler = optimizer.scaler();
  if constexpr (!std::is_same_v<T, float>)
    state.load_params = [units = d.units, starts, replicated, rank,
                         params](std::span<const float> values) {
      for (size_t u = 0; u < units.size(); ++u) {
        const ShardUnit& s = units[u];
        const int64_t begin = replicated ? s.offset : s.offset + rank * s.shard_size,
                      n = replicated ? s.size : shard_real(s, rank);
        if (n > 0) narrow_into(values.subspan(begin, n), params.subspan(starts[u], n));
      }
    };
  return state;
}

}  // namespace ringzero
