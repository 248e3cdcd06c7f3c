// zero_lesson: what the three ZeRO lessons (chapters 06-08) share word for word, written once:
// their common flags (--collectives, the memory calculator), the summary fields every stage
// reports and ZeRO-3's --explain-layers table. The rest of the summary (buckets or layers,
// prefetch, in flight) is derived from the engine's description (engine_lesson.hpp's
// engine_summary_fields).
// Leaves out: the stages themselves (chapters/06_zero1, 07_zero2, 08_zero3).
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "common/comm/collectives.hpp"
#include "common/core/nn.hpp"
#include "common/driver/engine_description.hpp"
#include "common/driver/run.hpp"
#include "common/report/metrics.hpp"
#include "common/zero/memory_calculator.hpp"

namespace ringzero {

/// The flags every ZeRO chapter has: --collectives (ring | mpi, into the stage's Options) and
/// the memory calculator (--memory-calculator --params --world-size [--mixed-precision]),
/// which prints the ZeRO paper's table instead of training. A chapter's Flags derive from it
/// and call add_zero_flags once, before registering their own.
struct ZeroFlags : LessonOptions {
  MemoryCalculatorFlags calculator;

  /// --collectives and the memory calculator's option group.
  void add_zero_flags(CommandLine& cli, Collectives& collectives) {
    add_collectives_flag(
        cli.app, collectives,
        "ring (ours, chapter 04) | mpi (MPI_Reduce_scatter_block + MPI_Allgather)");
    add_memory_calculator_flags(cli.app, calculator);
  }
  bool run_instead(Communicator*) override {
    if (calculator.enabled) print0(memory_calculator(calculator));
    return calculator.enabled;
  }
};

/// The end-of-run summary fields of every ZeRO stage (the metrics' "summary" record): the
/// stage, --collectives, the exact model-state bytes of every rank, the padding elements and
/// the theory's bytes sent per rank per step.
inline nlohmann::json zero_summary_fields(int zero_stage, Collectives collectives,
                                          const std::vector<int64_t>& model_states_exact_bytes,
                                          int64_t padding, const TrafficTheory& theory) {
  return {{"zero_stage", zero_stage},
          {"collectives", collectives_name(collectives)},
          {"model_states_exact_bytes", model_states_exact_bytes},
          {"padding", padding},
          {"theory_bytes_sent_per_rank_per_step", theory.bytes_sent}};
}

/// ZeRO-3's --explain-layers table (chapter 08): one line per layer of `layers`, in forward
/// order, each beside its unit of `units` (the engine's description: Ψ_l elements, shard size
/// s_l; padding N·s_l − Ψ_l) and its parameters' names.
inline std::string explain_layer_shards(const std::vector<Linear*>& layers,
                                        const std::vector<ShardUnit>& units, int world_size) {
  char line[256];
  std::snprintf(
      line, sizeof line,
      "layer plan: %zu layers, each padded to a multiple of N = %d and cut into N shards:\n",
      layers.size(), world_size);
  std::string out = line;
  for (size_t l = 0; l < layers.size(); ++l) {
    const ShardUnit& s = units[l];
    std::snprintf(
        line, sizeof line,
        "  layer %-4s | %10lld elements | padding %2lld | shard %9lld elements (%s) | %s, %s\n",
        layers[l]->name().c_str(), static_cast<long long>(s.size),
        static_cast<long long>(world_size * s.shard_size - s.size),
        static_cast<long long>(s.shard_size), human_bytes(4.0 * s.shard_size).c_str(),
        layers[l]->weight.name().c_str(), layers[l]->bias.name().c_str());
    out += line;
  }
  return out;
}

}  // namespace ringzero
