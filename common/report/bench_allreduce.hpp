// Bus-bandwidth benchmark of an all-reduce of ours against MPI_Allreduce (chapter 04's
// --bench-allreduce times its ring_all_reduce).
//
// Definitions as nccl-tests (doc/PERFORMANCE.md): for an all-reduce of S bytes taking t
// seconds, algbw = S / t and busbw = algbw · 2(N − 1)/N. The factor is the fraction of the
// buffer each rank must send (and receive) in a bandwidth-optimal all-reduce, so busbw is
// comparable across N and with the link's bandwidth: a perfect ring runs at busbw = link speed.
//
// Method: sizes 4 KiB, 16 KiB, ..., 64 MiB of float32. Each size is first CHECKED: every rank
// fills the buffer with integers (rank + 1)·(i mod 13 + 1), all-reduces it once with the ring
// and once with MPI_Allreduce, and both results must equal the exact sum on every element
// (small integers add exactly in float32 in any order); a wrong ring stops the benchmark with
// the element and the values. It is then timed on zeros: repeated in-place sums of zeros never
// overflow and never go denormal, and the adds cost the same whatever the values. For each
// size, a warm-up call of each, then `rounds` rounds that alternate ours and MPI's, each round
// timing `iters` back-to-back calls on rank 0 after a barrier; the best round counts (the least
// disturbed by other processes on a shared machine). The scratch buffer is allocated once, as
// a training loop would keep it.
// Leaves out: out-of-place variants, other dtypes.
#pragma once

#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <span>

#include "common/comm/comm.hpp"
#include "common/core/check.hpp"
#include "common/core/ledger.hpp"

namespace ringzero {

/// The all-reduce under test: sums `data` over ranks in place on every rank; `scratch` holds at
/// least ceil(n / N) floats (one ring chunk of the largest size).
using AllReduceFn = void (*)(Communicator& comm, std::span<float> data, std::span<float> scratch);

/// The benchmark's correctness check for one size: ring and MPI_Allreduce both give the exact
/// sum of (rank + 1)·(i mod 13 + 1) over ranks on every element; leaves `data` zeroed for the
/// timing. Errors: the first wrong element, with expected and got, on the rank that sees it.
inline void check_sizes(Communicator& comm, AllReduceFn ours, std::span<float> data,
                        std::span<float> scratch) {
  const int N = comm.world_size(), r = comm.rank();
  for (bool ring : {true, false}) {
    for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<float>((r + 1) * (i % 13 + 1));
    if (ring)
      ours(comm, data, scratch);
    else
      comm.all_reduce(data);
    for (size_t i = 0; i < data.size(); ++i) {
      const auto expected = static_cast<float>(N * (N + 1) / 2 * (i % 13 + 1));
      RZ_CHECK(data[i] == expected, (ring ? "our all-reduce" : "MPI_Allreduce")
                                        << " of " << data.size() * 4 << " bytes: element " << i
                                        << " is " << data[i] << ", expected " << expected
                                        << " (the benchmark checks before it times)");
    }
  }
  std::fill(data.begin(), data.end(), 0.0f);
}

/// Prints the table (rank 0): for each size, microseconds, algbw and busbw of `ours` and of
/// MPI_Allreduce, and their ratio. Collective. Errors: one rank (nothing to all-reduce); a
/// wrong sum (check_sizes).
inline void bench_allreduce(Communicator& comm, AllReduceFn ours) {
  const int N = comm.world_size();
  RZ_CHECK(N >= 2, "--bench-allreduce on "
                       << N << " rank: nothing to all-reduce; run it with mpirun -np 2 (or more)");
  constexpr int64_t kMaxBytes = int64_t{64} << 20;
  Buffer buf(kMaxBytes / 4, MemTag::comm_buffers);  // (S / 4) the data, zeros
  Buffer scratch((kMaxBytes / 4 + N - 1) / N, MemTag::comm_buffers);  // (S / 4N) one chunk
  char line[256];
  std::snprintf(line, sizeof line,
                "all-reduce bus bandwidth, float32 sum, %d ranks (busbw = S/t * 2(N-1)/N)", N);
  print0(line);
  std::snprintf(line, sizeof line, "%10s | %12s %10s %10s | %12s %10s %10s | %s", "bytes",
                "ring us", "algbw", "busbw", "mpi us", "algbw", "busbw", "ring/mpi");
  print0(line);
  for (int64_t bytes = 4096; bytes <= kMaxBytes; bytes *= 4) {
    std::span<float> data = buf.span().first(static_cast<size_t>(bytes / 4));
    const int iters = bytes < (int64_t{1} << 20) ? 200 : bytes < (int64_t{16} << 20) ? 20 : 5;
    check_sizes(comm, ours, data, scratch.span());
    const int rounds = 3;
    auto time_it = [&](bool ring) {
      comm.barrier();
      const double t0 = MPI_Wtime();
      for (int i = 0; i < iters; ++i) {
        if (ring)
          ours(comm, data, scratch.span());
        else
          comm.all_reduce(data);
      }
      return (MPI_Wtime() - t0) / iters;
    };
    time_it(true), time_it(false);  // warm-up: first-touch pages, MPI's connection set-up
    double best_ring = 1e30, best_mpi = 1e30;
    for (int round = 0; round < rounds; ++round) {
      best_ring = std::min(best_ring, time_it(true));
      best_mpi = std::min(best_mpi, time_it(false));
    }
    const double bus = 2.0 * (N - 1) / N, S = static_cast<double>(bytes);
    std::snprintf(line, sizeof line, "%10lld | %12.1f %10.2f %10.2f | %12.1f %10.2f %10.2f | %.2f",
                  static_cast<long long>(bytes), best_ring * 1e6, S / best_ring / 1e9,
                  S / best_ring / 1e9 * bus, best_mpi * 1e6, S / best_mpi / 1e9,
                  S / best_mpi / 1e9 * bus, best_mpi / best_ring);
    print0(line);
  }
  print0("(GB/s, decimal; ring/mpi > 1 means ours is faster)");
}

}  // namespace ringzero
