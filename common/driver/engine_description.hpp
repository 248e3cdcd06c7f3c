// engine_description: what a data-parallel engine is, as data, written once by each engine
// (its describe()) and read by the shared driver (engine_lesson.hpp), the cost model, the
// summary record, checkpoints (shard_state.hpp) and the GPU planner (device_ext.cpp).
//
// Provides: EngineDescription (stage, unit, unit sizes, collectives, prefetch, the units'
// offsets and shard sizes, padding, bytes in flight) and ShardUnit.
// Leaves out: what is derived from it (engine_lesson.hpp); the chapter's theory (its formulas).
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/comm/collectives.hpp"
#include "common/core/check.hpp"

namespace ringzero {

/// One unit (bucket or layer) of a sharded engine, in the model's unpadded flat layout: rank r
/// owns [offset + r·shard_size, + shard_size) of it, the part past offset + size being padding
/// (chapter 06's shard.hpp, chapter 08's layer_shard.hpp).
struct ShardUnit {
  int64_t offset = 0;      ///< its first element
  int64_t size = 0;        ///< its real elements (a bucket's n, a layer's Ψ_l)
  int64_t shard_size = 0;  ///< s = ceil(size / N), the same on every rank
};

/// What a data-parallel engine is, as data. The driver's banner, the cost model's schedule,
/// the summary record's shared fields (engine_lesson.hpp), a checkpoint's pieces
/// (shard_state.hpp) and the GPU planner's plan (device_ext.cpp) are derived from it, the same
/// way for chapters 05-08 (chapters 03-04 describe their reduction: the GPU planner reads it,
/// and replicated_lesson.hpp derives chapter 04's banner and summary field from it).
struct EngineDescription {
  /// 0: no sharding, every rank holds every model state (chapters 03-05); 1, 2, 3: the ZeRO
  /// paper's P_os, P_os+g, P_os+g+p (Rajbhandari et al. 2020, §5).
  int zero_stage = 0;
  /// What one collective moves: "model" (chapter 03's whole gradient), "parameters" (chapter
  /// 04: one all-reduce each), "buckets" (PyTorch DDP's, chapters 05-07) or "layers" (FSDP's
  /// units, chapter 08).
  std::string unit = "buckets";
  /// Elements of each unit, in the order the step posts their collectives, as the cost model
  /// replays them (CommSchedule::sizes): a bucket's real elements, a layer's padded P_l.
  std::vector<int64_t> unit_sizes;
  Collectives collectives = Collectives::ring;
  /// true: the gradients are summed at rank 0, which steps alone and broadcasts the parameters
  /// (chapter 03's central reducer); false: every rank takes part in every collective.
  bool central = false;
  /// Chapter 08: whether the next layer's all-gather is posted while this layer computes;
  /// nullopt where the engine has no such choice.
  std::optional<bool> prefetch;
  /// N: the ranks the units are sharded over (and the gradients summed over).
  int world_size = 1;
  /// ZeRO: every unit, in the order of its collectives (checkpoints derive what this rank
  /// holds from it: common/zero/shard_state.hpp); empty without sharding (chapters 03-05).
  std::vector<ShardUnit> units;
  /// Zero elements added so that every unit splits into N equal shards (shard.hpp's padding).
  int64_t padding = 0;
  /// Units whose full buffers exist at once during backward (0: every one; ZeRO-2's double
  /// buffer: 2).
  int max_in_flight = 0;
  /// Bytes of the units in flight at the peak (ZeRO-2's buckets, ZeRO-3's gathered layers);
  /// nullopt where every unit is always allocated.
  std::optional<int64_t> in_flight_peak_bytes;
  /// true: every forward runs collectives (ZeRO-3 gathers each layer), so evaluation runs in
  /// lockstep on every rank (evaluate_in_lockstep, common/driver/dist_eval.hpp).
  bool collective_forward = false;
  /// true: set-up moved the parameters into the engine's own buffers (ZeRO's padded buffers,
  /// 16-bit master weights), so the ledger's peaks restart once it exists: the moment they
  /// existed twice is set-up, not training.
  bool reset_ledger_peaks = true;
};

/// The largest shard size s over `units` (0 without units): a collective's largest chunk.
inline int64_t largest_shard(const std::vector<ShardUnit>& units) {
  int64_t s = 0;
  for (const ShardUnit& u : units) s = std::max(s, u.shard_size);
  return s;
}

/// The most bytes of full units alive at once when a unit's full buffer lives from its first use
/// until at most `max_in_flight` − 1 later units are in use (ZeRO-2's double buffer: 2): the
/// largest sum over `max_in_flight` consecutive units (fewer at the start), each N·shard_size
/// elements of `element_bytes`. 0 without units. Errors: max_in_flight < 1 (the description's 0,
/// every unit at once, has no window: its peak is every unit).
inline int64_t in_flight_peak_bytes(const std::vector<ShardUnit>& units, int world_size,
                                    int max_in_flight, int64_t element_bytes) {
  RZ_CHECK(max_in_flight >= 1,
           "in_flight_peak_bytes: max_in_flight " << max_in_flight << " must be at least 1");
  int64_t most = 0;
  for (size_t u = 0; u < units.size(); ++u) {
    int64_t elements = 0;
    for (size_t v = u + 1 - std::min<size_t>(u + 1, max_in_flight); v <= u; ++v)
      elements += world_size * units[v].shard_size;
    most = std::max(most, element_bytes * elements);
  }
  return most;
}

}  // namespace ringzero
