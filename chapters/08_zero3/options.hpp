// The options and flags of chapter 08's ZeRO-3 engine: --collectives and the memory calculator
// (common/zero_lesson.hpp's ZeroFlags), --no-prefetch, --find-unused-parameters and
// --explain-layers.
// Leaves out: the engine (zero3.hpp).
#pragma once

#include "common/collectives.hpp"
#include "common/trace.hpp"
#include "common/zero_lesson.hpp"

namespace ringzero {

/// The options of chapter 08's engine.
struct Zero3Options {
  Collectives collectives =
      Collectives::ring;  ///< ring (chapter 04's) | mpi (MPI_Allgather, MPI_Reduce_scatter_block)
  bool prefetch = true;   ///< post the next layer's all-gather while this one computes
  /// A layer whose backward did not run in a step counts as a zero gradient, as chapter 05's
  /// find_unused_parameters; without it, finalize_backward() names its parameters and fails.
  bool find_unused_parameters = false;
  Tracer* tracer = nullptr;  ///< optional: posts, collectives, waits and each layer's compute
};

/// Chapter 08's flags: the engine's options, --no-prefetch, --find-unused-parameters,
/// --explain-layers, and ZeroFlags'
/// (--collectives, the memory calculator).
struct Zero3Flags : ZeroFlags {
  Zero3Options zero;
  bool explain = false, no_prefetch = false;

  void add_flags(CommandLine& cli) override {
    add_zero_flags(cli, zero.collectives);
    cli.app.add_flag(
        "--no-prefetch", no_prefetch,
        "post each all-gather only when its layer needs it; wait for every collective");
    cli.app.add_flag("--find-unused-parameters", zero.find_unused_parameters,
                     "count a layer whose backward did not run as a zero gradient instead of "
                     "failing (chapters 05-07's flag)");
    cli.app.add_flag("--explain-layers", explain,
                     "print the layer plan (elements, padding, shard size per layer)");
  }

  /// The engine's options, tracing into the run's `tracer`.
  Zero3Options options(Tracer& tracer) const {
    Zero3Options o = zero;
    o.tracer = &tracer;
    o.prefetch = !no_prefetch;
    return o;
  }
};

}  // namespace ringzero
