// The options and flags of the bucketed ZeRO engines (chapters 06-07, which share them
// unchanged): chapter 05's bucket flags, --collectives, --explain-buckets and the memory
// calculator (common/zero/zero_lesson.hpp's ZeroFlags).
// Leaves out: the engines (zero.hpp).
#pragma once

#include "chapters/05_ddp_buckets/options.hpp"
#include "common/zero/zero_lesson.hpp"

namespace ringzero {

/// The options of chapters 06-07's engines: chapter 05's, unchanged (--collectives mpi:
/// MPI_Reduce_scatter_block and MPI_Allgather in place of MPI_Allreduce).
using ZeroOptions = DDPOptions;

/// Chapters 06-07's flags: the engine's options, --explain-buckets, and ZeroFlags'
/// (--collectives, the memory calculator).
struct ZeroBucketFlags : ZeroFlags {
  ZeroOptions options;  ///< the engine's (EngineLesson adds the run's tracer)
  bool explain = false;

  void add_flags(CommandLine& cli) override {
    add_zero_flags(cli, options.collectives);
    add_bucket_flags(cli, options);  // common/driver/bucket_tools.hpp
    cli.app.add_flag("--explain-buckets", explain,
                     "print the bucket plan (buckets, parameters, elements, bytes)");
  }
};

}  // namespace ringzero
