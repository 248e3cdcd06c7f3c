// shard_state: the state of a sharded engine (ZeRO, chapters 06-08) as a checkpoint saves and
// loads it and as --save-final/--save-optimizer-state write it whole, derived from the engine's
// description (engine_description.hpp) once for every stage: which elements this rank holds,
// where they sit in the engine's parameter buffer, the layout the manifest records, and the
// shards gathered back under the model's names.
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
#include <map>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "common/comm/comm.hpp"
#include "common/core/check.hpp"
#include "common/core/ledger.hpp"
#include "common/core/nn.hpp"
#include "common/driver/engine_description.hpp"
#include "common/io/checkpoint.hpp"
#include "common/io/safetensors.hpp"
#include "common/precision/shard_buffers.hpp"
#include "common/precision/shard_precision.hpp"

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

/// Elements of the padding in `buffer` that are not zero: 0 while the padding invariant holds
/// (chapter 06's shard.hpp: allocated zero, never written; the tests check it). `buffer` is
/// laid out as the engine's parameter buffer (unit_starts), or, with `shards`, as this rank's
/// shard of every unit one after the other in the units' order (ZeRO-2's gradient shard).
template <class E>
int64_t count_nonzero_padding(const EngineDescription& d, int rank, std::span<E> buffer,
                              bool shards) {
  const std::vector<int64_t> starts = unit_starts(d);
  const bool whole = !shards && d.zero_stage < 3;  // padded units, each padding at its end
  int64_t count = 0, shard_start = 0;  // shard_start: Σ s of the units before, in their order
  for (size_t u = 0; u < d.units.size(); ++u) {
    const ShardUnit& unit = d.units[u];
    const int64_t start = shards ? shard_start : starts[u],
                  end = start + (whole ? d.world_size : 1) * unit.shard_size;
    for (int64_t i = start + (whole ? unit.size : shard_real(unit, rank)); i < end; ++i)
      count += static_cast<float>(buffer[i]) != 0.0f;
    shard_start += unit.shard_size;
  }
  return count;
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

/// The training state common/io/checkpoint.hpp saves and loads for the sharded engine `d` on
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

/// Collective, after the run's report (its traffic is not a step's): the per-unit fp32 state
/// of(u) (this rank's real elements of unit u, in order: a parameter shard, master weights, a
/// moment) gathered whole on every rank, as "<param><suffix>" with the parameter's shape.
/// all_gather(u, unit): the engine's all-gather of unit u's padded buffer (N·s fp32 elements,
/// rank r's shard at r·s), called on every rank in unit order.
template <class Of, class AllGather>
std::map<std::string, NamedTensor> gather_units(const EngineDescription& d, const Model& model,
                                                int rank, Of of, AllGather all_gather,
                                                const std::string& suffix = "") {
  const auto& params = model.parameters();
  std::map<std::string, NamedTensor> out;
  for (size_t u = 0; u < d.units.size(); ++u) {
    const ShardUnit& s = d.units[u];
    Buffer full(d.world_size * s.shard_size, MemTag::comm_buffers);  // (N s) unit u, gathered
    std::span<const float> mine = of(u);  // on the host, or the engine's device
    copy_elements(mine, full.span().subspan(rank * s.shard_size, mine.size()));
    all_gather(u, full.span());
    for (size_t i = 0; i < params.size(); ++i) {  // a unit holds whole parameters
      const int64_t at = model.offsets()[i] - s.offset;
      if (at < 0 || at >= s.size) continue;
      const float* v = full.data() + at;
      out[params[i]->name() + suffix] = {params[i]->shape(), {v, v + params[i]->numel()}};
    }
  }
  return out;
}

/// Collective, for --save-optimizer-state and the equivalence tests: the AdamW state of
/// `optimizer` (in 16 bits the master weights' moments) gathered whole and named as PyTorch's
/// optimizer state is per parameter: "<param>.exp_avg", "<param>.exp_avg_sq" (its shape) and
/// "<param>.step" (shape (1)). all_gather: as gather_units'. Errors: --optimizer sgd; pieces of
/// a parameter whose step counts differ.
template <class AllGather>
std::map<std::string, NamedTensor> gather_optimizer_state(const EngineDescription& d,
                                                          Communicator& comm, const Model& model,
                                                          const ShardOptimizer& optimizer,
                                                          AllGather all_gather) {
  const int rank = comm.rank();
  auto out = gather_units(
      d, model, rank, [&](size_t u) { return optimizer.exp_avg(u); }, all_gather, ".exp_avg");
  out.merge(gather_units(
      d, model, rank, [&](size_t u) { return optimizer.exp_avg_sq(u); }, all_gather,
      ".exp_avg_sq"));
  const auto& params = model.parameters();
  std::vector<double> steps(3 * params.size(), 0.0);  // (P, 3) Σ step, Σ step², pieces
  for (size_t u = 0; u < d.units.size(); ++u) {
    const ShardUnit& s = d.units[u];
    const std::vector<int> segment_params =
        params_in(model, s.offset + rank * s.shard_size, shard_real(s, rank));
    const std::vector<int64_t>& segment_steps = optimizer.segment_steps(u);
    RZ_CHECK(segment_steps.size() == segment_params.size(),
             "unit " << u << ": " << segment_steps.size() << " step counts for "
                     << segment_params.size() << " parameter pieces");
    for (size_t k = 0; k < segment_steps.size(); ++k) {
      const auto t = static_cast<double>(segment_steps[k]);
      double* st = &steps[3 * segment_params[k]];
      st[0] += t, st[1] += t * t, st[2] += 1;
    }
  }
  comm.all_reduce_metrics(steps);
  for (size_t i = 0; i < params.size(); ++i) {
    const double* st = &steps[3 * i];
    RZ_CHECK(st[1] * st[2] == st[0] * st[0],
             "the pieces of " << params[i]->name() << " took different numbers of steps");
    out[params[i]->name() + ".step"] = {{1}, {static_cast<float>(st[0] / st[2])}};
  }
  return out;
}

/// Collective, --save-final: the weights whole under the model's state_dict() names. fp32
/// ZeRO-1/2: the model's own (every rank holds them); fp32 ZeRO-3: the parameter shards in
/// `params` (the engine's buffer) gathered; 16 bits: the fp32 master weights gathered.
template <Element T, class AllGather>
std::map<std::string, NamedTensor> gather_weights(const EngineDescription& d, const Model& model,
                                                  int rank, const ShardOptimizer& optimizer,
                                                  std::span<const T> params,
                                                  AllGather all_gather) {
  if constexpr (std::is_same_v<T, float>) {
    if (d.zero_stage < 3) return state_dict(model);
    const std::vector<int64_t> starts = unit_starts(d);
    return gather_units(
        d, model, rank,
        [&](size_t u) { return params.subspan(starts[u], shard_real(d.units[u], rank)); },
        all_gather);
  } else {
    return gather_units(
        d, model, rank, [&](size_t u) { return optimizer.master(u); }, all_gather);
  }
}

/// A ZeRO engine (chapters 06-08's Zero1, Zero2, Zero3) as the exporters below use it:
/// describe() (its units), comm(), optimizer() (its ShardOptimizer), parameter_storage() (the
/// std::span<T> of its parameter buffer, laid out as unit_starts() says), gradient_storage()
/// (its gradients' buffer: nonzero_padding) and gather_state(u,
/// buffer) (collective: unit u's padded fp32 buffer all-gathered, rank r's shard at r·shard_size;
/// every rank calls it for the same units in the same order, as gather_units does).
template <class Engine>
concept ShardedEngine = requires(Engine& e, std::span<float> buffer) {
  e.describe();
  e.comm();
  e.optimizer();
  e.parameter_storage();
  e.gradient_storage();
  e.gather_state(size_t{0}, buffer);
};

/// Elements of the padding of a ZeRO engine's parameter and gradient storage that are not zero:
/// must be 0 (count_nonzero_padding; the tests check it after every step). The engine's
/// gradient_storage() is laid out as its parameter_storage() (ZeRO-1's padded buckets, ZeRO-3's
/// layer shards), or, in ZeRO-2, as the shard of every bucket one after the other.
template <ShardedEngine Engine>
int64_t nonzero_padding(Engine& engine) {
  const EngineDescription d = engine.describe();
  return count_nonzero_padding(d, engine.comm().rank(), engine.parameter_storage(), false) +
         count_nonzero_padding(d, engine.comm().rank(), engine.gradient_storage(),
                               d.zero_stage == 2);
}

/// The training state a checkpoint saves and loads, of a ZeRO engine over `model` (the model the
/// engine was built on): this rank's pieces, views into the engine's buffers, valid while the
/// engine lives (sharded_training_state above). Not collective.
template <ShardedEngine Engine>
TrainingState sharded_training_state(Engine& engine, Model& model) {
  return sharded_training_state(engine.describe(), model, engine.comm().rank(), engine.optimizer(),
                                engine.parameter_storage());
}

/// Collective, --save-optimizer-state and the equivalence tests: a ZeRO engine's AdamW state
/// gathered whole, exp_avg then exp_avg_sq, one gather_state per unit each, and the step count
/// (gather_optimizer_state, which names its errors: an optimizer without AdamW state, step
/// counts that differ across ranks).
template <ShardedEngine Engine>
std::map<std::string, NamedTensor> sharded_optimizer_state_dict(Engine& engine,
                                                                const Model& model) {
  return gather_optimizer_state(engine.describe(), engine.comm(), model, engine.optimizer(),
                                [&](size_t u, std::span<float> b) { engine.gather_state(u, b); });
}

/// Collective (except fp32 ZeRO-1/2, which sends nothing), --save-final: a ZeRO engine's weights
/// under the state_dict() names of `model` (the engine's): the model's own in fp32 ZeRO-1/2, the
/// shards gathered in fp32 ZeRO-3, the fp32 master weights gathered in 16 bits (gather_weights).
template <ShardedEngine Engine>
std::map<std::string, NamedTensor> sharded_model_state_dict(Engine& engine, const Model& model) {
  using T = typename decltype(engine.parameter_storage())::element_type;
  return gather_weights<T>(engine.describe(), model, engine.comm().rank(), engine.optimizer(),
                           std::span<const T>(engine.parameter_storage()),
                           [&](size_t u, std::span<float> b) { engine.gather_state(u, b); });
}

}  // namespace ringzero
