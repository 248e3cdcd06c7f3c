// The options and flags of chapter 05's DDP engine: the bucket flags, --collectives and
// --explain-buckets.
// Leaves out: the engine (ddp.hpp).
#pragma once

#include "chapters/05_ddp_buckets/buckets.hpp"
#include "common/comm/collectives.hpp"
#include "common/driver/run.hpp"
#include "common/report/trace.hpp"

namespace ringzero {

/// The options of chapter 05's engine.
struct DDPOptions {
  double bucket_cap_mb = 25.0;       ///< PyTorch's default
  double first_bucket_cap_mb = 1.0;  ///< PyTorch's dist._DEFAULT_FIRST_BUCKET_BYTES
  bool find_unused_parameters = false;
  Collectives collectives =
      Collectives::ring;  ///< ring (chapter 04's) | mpi (MPI_Allreduce, which spins while it waits)
  Tracer* tracer = nullptr;  ///< optional: launch and all-reduce events
};

/// Chapter 05's flags: the engine's options and --explain-buckets.
struct DDPFlags : LessonOptions {
  DDPOptions options;  ///< the engine's (EngineLesson adds the run's tracer)
  bool explain = false;

  void add_flags(CommandLine& cli) override {
    add_collectives_flag(cli.app, options.collectives, "ring (chapter 04's) | mpi (MPI_Allreduce)");
    add_bucket_flags(cli, options, explain);  // common/driver/bucket_tools.hpp
  }
};

}  // namespace ringzero
