// The options and flags of chapter 08's ZeRO-3 engine.
// Leaves out: the engine (zero3.hpp).
#pragma once

#include "common/comm/collectives.hpp"
#include "common/report/trace.hpp"
#include "common/zero/zero_lesson.hpp"

namespace ringzero {

/// The options of chapter 08's engine.
struct Zero3Options {
  Collectives collectives =
      Collectives::ring;  ///< ring (chapter 04's) | mpi (MPI_Allgather, MPI_Reduce_scatter_block)
  bool prefetch = true;   ///< post the next layer's all-gather while this one computes
  /// A layer whose backward did not run in a step counts as a zero gradient, as chapter 05's
  /// find_unused_parameters; without it, finalize_backward() names its parameters and fails.
  bool find_unused_parameters = false;
  Tracer* tracer = nullptr;  ///< optional: the collectives and the waits for them
};

/// Chapter 08's flags: the engine's options, --no-prefetch, --find-unused-parameters,
/// --explain-layers, and ZeroFlags' (--collectives, the memory calculator).
struct Zero3Flags : ZeroFlags {
  Zero3Options options;  ///< the engine's (EngineLesson adds the run's tracer)
  bool explain = false;

  void add_flags(CommandLine& cli) override {
    add_zero_flags(cli, options.collectives);
    cli.app.add_flag_callback(
        "--no-prefetch", [this] { options.prefetch = false; },
        "post each all-gather only when its layer needs it; wait for every collective");
    cli.app.add_flag("--find-unused-parameters", options.find_unused_parameters,
                     "count a layer whose backward did not run as a zero gradient instead of "
                     "failing (chapters 05-07's flag)");
    cli.app.add_flag("--explain-layers", explain,
                     "print the layer plan (elements, padding, shard size per layer)");
  }
};

}  // namespace ringzero
