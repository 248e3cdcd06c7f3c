// zero_lesson: what the three ZeRO lessons (chapters 06-08) share word for word, written once:
// their common flags (--collectives, the memory calculator; chapters 06-07's bucket flags), the
// summary fields every stage reports and ZeRO-3's --explain-layers table. The rest of the
// summary (buckets or layers, prefetch, in flight) is derived from the engine's description
// (engine_lesson.hpp's engine_summary_fields).
// Leaves out: the stages themselves (chapters/06_zero1, 07_zero2, 08_zero3).
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "common/comm/collectives.hpp"
#include "common/core/nn.hpp"
#include "common/driver/bucket_tools.hpp"
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

/// The flags of the ZeRO stages on chapter 05's buckets (chapters 06 and 07): ZeroFlags',
/// chapter 05's bucket flags (bucket_tools.hpp) into `options`, and --explain-buckets.
/// Options: the engine's (chapter 05's DDPOptions, unchanged).
template <class Options>
struct ZeroBucketFlagsOf : ZeroFlags {
  Options options;  ///< the engine's (EngineLesson adds the run's tracer)
  bool explain = false;

  void add_flags(CommandLine& cli) override {
    add_zero_flags(cli, options.collectives);
    add_bucket_flags(cli, options, explain);  // bucket_tools.hpp
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

/// The traffic theory's text line of a ZeRO engine (the summary's and the report's "theory"),
/// derived from its description `d` (stage, collectives, N, units and their shard sizes): the
/// ZeRO paper's bytes per rank per step (Rajbhandari et al. 2020, §7: 2Ψ for stages 1-2, 3Ψ for
/// stage 3, times (N − 1)/N and the element bytes), then the chapter's exact count
/// `exact_sent` (bytes rank 0 sends per optimizer step, from the chapter's own formula) and the
/// counts it is made of. psi: Ψ, real parameters; grad_bytes, param_bytes: bytes per element of
/// the reduce-scatter (R) and of the all-gathers (T); grad_accum_steps: K (stage 3 gathers
/// every micro-step). 16 bits: the ring only (the engines refuse --collectives mpi).
inline std::string zero_traffic_formula(const EngineDescription& d, int64_t psi, int grad_bytes,
                                        int param_bytes, int64_t exact_sent,
                                        int64_t grad_accum_steps = 1) {
  const bool ring = d.collectives == Collectives::ring;
  int64_t padded = 0;  // Σ N·s over units: Ψ + padding
  for (const ShardUnit& u : d.units) padded += d.world_size * u.shard_size;
  const std::string N = std::to_string(d.world_size), g = std::to_string(grad_bytes),
                    p = std::to_string(param_bytes), exact = human_bytes(exact_sent);
  const std::string counts =
      "; N = " + N + ", Ψ = " + std::to_string(psi) + ", padding = " + std::to_string(padded - psi);
  const double n = d.world_size, psi_d = static_cast<double>(psi);
  if (d.zero_stage == 3) {
    std::string theory =
        "MPI_Allgather x 2 + MPI_Reduce_scatter_block per layer: counters show "
        "the payload handed to MPI, not its wire traffic";
    if (ring) {
      theory =
          "theory (ZeRO-3: per micro-step and layer, all-gather forward + all-gather "
          "backward + reduce-scatter): every rank sends ";
      theory +=
          param_bytes == grad_bytes ? "3(N-1)/N·" + p + "Ψ" : "(N-1)/N·(2·" + p + " + " + g + ")Ψ";
      theory +=
          " = " +
          human_bytes((n - 1) / n * static_cast<double>(2 * param_bytes + grad_bytes) * psi_d) +
          " per micro-step";
      if (param_bytes == grad_bytes) {
        theory += ", 1.5x DDP's 2(N-1)/N·" + p +
                  "Ψ = " + human_bytes(2 * (n - 1) / n * static_cast<double>(param_bytes) * psi_d);
        // ZeRO-3 gathers and reduces every micro-step; chapters 05-07 reduce once a step.
        if (grad_accum_steps > 1)
          theory += " (per optimizer step K·1.5x = " + std::to_string(3 * grad_accum_steps / 2) +
                    (grad_accum_steps % 2 ? ".5" : "") +
                    "x chapters 05-07's, which reduce once: no_sync)";
      }
    }
    return theory +
           "; exactly (padding, 16-byte desync headers, K = " + std::to_string(grad_accum_steps) +
           " micro-steps): " + exact + counts + ", L = " + std::to_string(d.units.size()) +
           " layers";
  }
  if (grad_bytes != 4 || param_bytes != 4)  // 16 bits
    return "theory (ring reduce-scatter of " + g + "-byte gradients + ring all-gather of " + p +
           "-byte parameters, per bucket): every rank sends (N-1)/N·(" + g + " + " + p +
           ")Ψ = " + human_bytes((n - 1) / n * (grad_bytes + param_bytes) * psi_d) +
           " per step; exactly " +
           (grad_bytes == param_bytes ? "2(N-1)/N·" + g + "(Ψ + padding)"
                                      : "(N-1)/N·(" + g + " + " + p + ")(Ψ + padding)") +
           " = " + exact + counts;
  return ring ? "theory (ring reduce-scatter of gradients + ring all-gather of parameters, per "
                "bucket): every rank sends 2(N-1)/N·4Ψ = " +
                    human_bytes(2 * (n - 1) / n * 4.0 * psi_d) +
                    " per step, as DDP; exactly 2(N-1)/N·4(Ψ + padding) = " + exact + counts
              : "MPI_Reduce_scatter_block + MPI_Allgather: counters show the payload handed to "
                "MPI, 4(Ψ + padding) = " +
                    exact + " per step, not its wire traffic" + counts;
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
