// collectives: which implementation of reduce-scatter / all-gather / all-reduce a chapter runs.
//
// Provides: Collectives (ring: ours, chapter 04's ring.hpp; mpi: MPI's own collectives),
// parsed once from --collectives by add_collectives_flag, and its name for reports.
// Leaves out: the collectives themselves (chapters/04_ring_allreduce/ring.hpp,
// common/comm/comm.hpp).
#pragma once

#include <CLI/CLI.hpp>

#include <string>

namespace ringzero {

/// --collectives: ring = chapter 04's ring (point-to-point, counted exactly), mpi = MPI's
/// collective (MPI_Allreduce, MPI_Reduce_scatter_block, MPI_Allgather; the counters see only
/// the payload handed to MPI).
enum class Collectives { ring, mpi };

/// "ring" or "mpi": the flag's value, as the banner and the metrics' "collectives" field print
/// it.
inline const char* collectives_name(Collectives c) {
  return c == Collectives::ring ? "ring" : "mpi";
}

/// Registers --collectives ring|mpi, stored into `collectives` once parsed. A bad value is
/// CLI11's IsMember error ("--collectives: x not in {ring,mpi}"), exit non-zero; the default
/// shown in --help and compared across ranks is `collectives`'s current value.
inline CLI::Option* add_collectives_flag(CLI::App& app, Collectives& collectives,
                                         const std::string& help) {
  return app
      .add_option_function<std::string>(
          "--collectives",
          [&collectives](const std::string& v) {
            collectives = v == "ring" ? Collectives::ring : Collectives::mpi;
          },
          help)
      ->check(CLI::IsMember({"ring", "mpi"}))
      ->default_str(collectives_name(collectives));
}

}  // namespace ringzero
