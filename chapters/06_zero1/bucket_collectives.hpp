// A padded bucket's collectives: the reduce-scatter of its gradient and the all-gather of its
// parameters, with chapter 04's ring or MPI's (--collectives), and the bytes they move per step.
//
// On the padded bucket every ring chunk is one shard (shard.hpp: "Why per bucket"), so rank r's
// chunk after the reduce-scatter is its shard. Chapters 06 and 07 call these once per bucket.
// Leaves out: the layout (shard.hpp), chapter 08's per-layer queueing (layer_collectives.hpp).
#pragma once

#include <cstdint>
#include <span>

#include "chapters/04_ring_allreduce/ring.hpp"
#include "chapters/06_zero1/shard.hpp"
#include "common/comm/collectives.hpp"
#include "common/comm/comm.hpp"
#include "common/comm/typed_collectives.hpp"
#include "common/core/check.hpp"
#include "common/core/device_memory.hpp"
#include "common/core/half.hpp"
#include "common/report/dist.hpp"

namespace ringzero {

/// Bytes each rank sends and receives per optimizer step: one reduce-scatter of the gradients
/// and one all-gather of the parameters, per padded bucket. With the ring every chunk is s, so
/// every rank moves 2 (N − 1) s elements per bucket: 2(N−1)/N · 4(Ψ + padding) bytes in fp32.
/// In 16 bits (--precision bf16|fp16) each element is `grad_bytes` on the reduce-scatter (2, or
/// 4 with --reduce-dtype fp32) and `param_bytes` = 2 on the all-gather: 2(N−1)/N · 2(Ψ + padding)
/// bytes, or (N−1)/N · (4 + 2)(Ψ + padding). With MPI's collectives the counters see only the
/// payload handed to MPI: the bucket to reduce less our block, and our block to gather, N s
/// per bucket (the wire traffic is MPI's); fp32 only. The text line beside the bytes is
/// derived from the engine's description (common/zero/zero_lesson.hpp's zero_traffic_formula).
inline TrafficTheory zero_traffic_theory(const ShardLayout& layout, int world_size,
                                         Collectives collectives, int grad_bytes = 4,
                                         int param_bytes = 4) {
  TrafficTheory theory;
  const bool ring = collectives == Collectives::ring;
  for (int r = 0; r < world_size; ++r) {
    int64_t sent = 0, received = 0;
    for (const BucketShard& b : layout.buckets) {
      const int64_t n = b.padded_size(), s = b.shard_size;
      sent += ring ? grad_bytes * ring_reduce_scatter_sent(n, world_size, r) +
                         param_bytes * ring_all_gather_sent(n, world_size, r)
                   : grad_bytes * (world_size - 1) * s + param_bytes * s;
      received += ring ? grad_bytes * ring_reduce_scatter_received(n, world_size, r) +
                             param_bytes * ring_all_gather_received(n, world_size, r)
                       : grad_bytes * s + param_bytes * (world_size - 1) * s;
    }
    theory.bytes_sent.push_back(sent);
    theory.bytes_received.push_back(received);
  }
  return theory;
}

/// Collective: reduce-scatters padded bucket `bucket` (n + padding elements of T: float, bf16
/// or fp16) over the ranks; returns this rank's shard, bucket[r s, (r+1) s), which then holds
/// the sum over ranks (the rest of the bucket holds partial sums). Collectives::ring: chapter
/// 04's first half, in place (in bf16/fp16 each hop adds in fp32 and rounds once); mpi:
/// MPI_Reduce_scatter_block (float only), which wants the output apart, through `scratch` (≥ s).
template <Element T>
std::span<T> reduce_scatter_bucket(Communicator& comm, std::span<T> bucket, int64_t shard_size,
                                   std::span<T> scratch, Collectives collectives) {
  std::span<T> shard = bucket.subspan(comm.rank() * shard_size, shard_size);
  if (collectives == Collectives::ring) {
    ring_reduce_scatter(comm, bucket, scratch);  // chapter 04's first half: our chunk is summed
  } else {                                       // MPI wants the output apart from the input
    mpi_reduce_scatter(comm, bucket, scratch.first(shard_size));
    copy_elements(scratch.first(shard_size), shard);
  }
  return shard;
}

/// Collective: all-gathers padded bucket `bucket` (n + padding elements of T) from every
/// rank's shard (this rank's in place at [r s, (r+1) s)). Collectives::ring: chapter 04's
/// second half (it copies: sizeof(T) bytes per element); mpi: MPI_Allgather (float only), which
/// wants the input apart, through `scratch` (≥ s).
template <Element T>
void all_gather_bucket(Communicator& comm, std::span<T> bucket, int64_t shard_size,
                       std::span<T> scratch, Collectives collectives) {
  if (collectives == Collectives::ring) {
    ring_all_gather(comm, bucket);  // chapter 04's second half
  } else {                          // MPI wants the input apart from the output
    std::span<T> shard = bucket.subspan(comm.rank() * shard_size, shard_size);
    copy_elements(shard, scratch.first(shard_size));
    mpi_all_gather(comm, scratch.first(shard_size), bucket);
  }
}

}  // namespace ringzero
