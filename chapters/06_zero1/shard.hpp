// Shards: which elements of the model each rank owns, in a layout padded per bucket, and a
// padded bucket's two collectives: its gradient's reduce-scatter and its parameters' all-gather.
//
// ZeRO splits every bucket (chapter 05's buckets.hpp, unchanged) into world_size equal shards.
// A bucket of n elements is padded with pad = (N − n mod N) mod N zeros to a multiple of N, so
// each shard has s = (n + pad) / N elements and rank r owns [r s, (r+1) s) of the padded
// bucket. The padded flat buffer keeps the model's memory order, each bucket followed by its
// own padding (here N = 3, a bucket of 7 elements: pad 2, s 3):
//
//   padded bucket   | a0 a1 a2 | a3 a4 a5 | a6 0  0 |     rank 2 owns one real element
//   owner           |  rank 0  |  rank 1  | rank 2  |     and two of padding
//
// Every ring chunk of a padded bucket is one shard, s = ceil(n / N): each real element is in
// the chunk it had in chapter 05's all-reduce of the unpadded bucket and is summed in the same
// order, so chapters 06 and 07 are bitwise equal to chapter 05 (padding each parameter would
// move the chunk boundaries); equal blocks are also what MPI's and NCCL's collectives need.
// Why per bucket (as DeepSpeed's flat partitions) rather than per parameter: README.md.
// Invariants: padding is allocated zero and nothing ever writes it (backward writes only
// parameters, the optimizer gets only the real elements of a shard, a reduce-scatter adds
// zeros to zeros, an all-gather copies the owner's zeros), so it adds nothing to norms. A
// bucket smaller than N leaves some ranks owning only padding; they still join every
// collective, with an empty optimizer. Padding is counted under its own ledger tag.
// Leaves out: parameter sharding (ZeRO-3 keeps only the shard of the parameters too).
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>
#include <vector>

#include "chapters/04_ring_allreduce/ring.hpp"
#include "chapters/05_ddp_buckets/buckets.hpp"
#include "common/comm/collectives.hpp"
#include "common/comm/comm.hpp"
#include "common/comm/typed_collectives.hpp"
#include "common/core/half.hpp"
#include "common/core/nn.hpp"
#include "common/driver/engine_description.hpp"
#include "common/report/dist.hpp"

namespace ringzero {

/// One bucket of the padded layout, and this rank's shard of it.
struct BucketShard {
  int64_t offset = 0;         ///< first element in the model's unpadded layout (Bucket::offset)
  int64_t size = 0;           ///< n, real elements
  int64_t padding = 0;        ///< (N − n mod N) mod N
  int64_t padded_offset = 0;  ///< first element in the padded flat buffer
  int64_t shard_size = 0;     ///< s = (n + padding) / N, the same on every rank
  int64_t shard_offset = 0;   ///< in a rank's shard buffer: Σ s of earlier buckets
  int64_t real = 0;           ///< real elements in this rank's shard: clamp(n − r s, 0, s)
  std::vector<int64_t> segments;    ///< parameter pieces in [r s, r s + real), memory order
  std::vector<int> segment_params;  ///< the parameter index of each segment
  int64_t padded_size() const { return size + padding; }
};

/// The padded layout of all buckets, for one rank.
struct ShardLayout {
  std::vector<BucketShard> buckets;   ///< plan order (the order of the collectives)
  std::vector<int64_t> param_offset;  ///< (P) each parameter's first element in the padded buffer
  int64_t padded_total = 0;           ///< Ψ + padding_total: the flat buffer's length
  int64_t padding_total = 0;          ///< Σ padding over buckets
  int64_t shard_total = 0;            ///< Σ s = (Ψ + padding_total) / N elements per rank
  int64_t shard_real = 0;             ///< Σ real: this rank's real elements (Σ over ranks = Ψ)
};

/// The layout of `plan` (chapter 05's buckets of `model`) for `rank` of `world_size`.
inline ShardLayout plan_shards(const Model& model, const std::vector<Bucket>& plan, int rank,
                               int world_size) {
  const int64_t N = world_size;
  ShardLayout layout;
  // Padding goes right after each bucket, so a bucket's padded offset grows by the padding of
  // every bucket below it in memory (buckets run in reverse memory order).
  std::vector<size_t> by_memory(plan.size());
  for (size_t b = 0; b < plan.size(); ++b) by_memory[b] = b;
  std::sort(by_memory.begin(), by_memory.end(),
            [&](size_t a, size_t b) { return plan[a].offset < plan[b].offset; });
  std::vector<int64_t> padding_below(plan.size(), 0);
  for (size_t b : by_memory) {
    padding_below[b] = layout.padding_total;
    layout.padding_total += (N - plan[b].size % N) % N;
  }
  layout.param_offset.resize(model.parameters().size());
  for (size_t b = 0; b < plan.size(); ++b) {
    BucketShard s;
    s.offset = plan[b].offset;
    s.size = plan[b].size;
    s.padding = (N - s.size % N) % N;
    s.padded_offset = s.offset + padding_below[b];
    s.shard_size = s.padded_size() / N;
    s.shard_offset = layout.shard_total;
    s.real = std::clamp(s.size - rank * s.shard_size, int64_t{0}, s.shard_size);
    const int64_t lo = rank * s.shard_size, hi = lo + s.real;  // ours, bucket-local
    for (auto it = plan[b].params.rbegin(); it != plan[b].params.rend(); ++it) {  // memory order
      const int p = *it;
      const int64_t begin = model.offsets()[p] - s.offset,
                    end = begin + model.parameters()[p]->numel();
      layout.param_offset[p] = s.padded_offset + begin;
      if (std::max(begin, lo) < std::min(end, hi)) {
        s.segments.push_back(std::min(end, hi) - std::max(begin, lo));
        s.segment_params.push_back(p);
      }
    }
    layout.shard_total += s.shard_size;
    layout.shard_real += s.real;
    layout.buckets.push_back(std::move(s));
  }
  layout.padded_total = model.num_parameters() + layout.padding_total;
  return layout;
}

/// The real elements rank `rank` owns, Σ clamp(n − rank s, 0, s): any rank computes any rank's.
inline int64_t shard_real_of(const ShardLayout& layout, int rank) {
  int64_t real = 0;
  for (const BucketShard& b : layout.buckets)
    real += std::clamp(b.size - rank * b.shard_size, int64_t{0}, b.shard_size);
  return real;
}

/// The layout's buckets as the engine description's units (common/driver/engine_description.hpp).
inline std::vector<ShardUnit> shard_units(const ShardLayout& layout) {
  std::vector<ShardUnit> units;
  for (const BucketShard& s : layout.buckets) units.push_back({s.offset, s.size, s.shard_size});
  return units;
}

/// Bytes each rank sends and receives per optimizer step: per padded bucket, a reduce-scatter
/// of the gradients (`grad_bytes` per element) and an all-gather of the parameters
/// (`param_bytes`). With the ring every chunk is one shard: (N − 1) s elements each way per
/// collective, (N−1)/N · (g + p)(Ψ + padding) bytes in all. With MPI the counters see only the
/// payload handed to MPI (the bucket less our block, and our block: N s per bucket).
inline TrafficTheory zero_traffic_theory(const ShardLayout& layout, int world_size,
                                         Collectives collectives, int grad_bytes = 4,
                                         int param_bytes = 4) {
  const bool ring = collectives == Collectives::ring;
  const int64_t g = grad_bytes, p = param_bytes, others = world_size - 1;
  int64_t sent = 0, received = 0;  // the same on every rank
  for (const BucketShard& b : layout.buckets) {
    const int64_t s = b.shard_size;
    sent += ring ? (g + p) * others * s : g * others * s + p * s;
    received += ring ? (g + p) * others * s : g * s + p * others * s;
  }
  TrafficTheory theory;
  theory.bytes_sent.assign(static_cast<size_t>(world_size), sent);
  theory.bytes_received.assign(static_cast<size_t>(world_size), received);
  return theory;
}

/// Collective: reduce-scatters padded bucket `bucket` (n + padding elements of T) over the
/// ranks; returns this rank's shard, bucket[r s, (r+1) s), which then holds the sum over ranks
/// (the rest, partial sums). ring: chapter 04's first half, in place (16 bits: each hop adds in
/// fp32, rounds once); mpi: MPI_Reduce_scatter_block (float). `scratch` (≥ s): the ring's
/// incoming chunk, or MPI's output.
template <Element T>
std::span<T> reduce_scatter_bucket(Communicator& comm, std::span<T> bucket, int64_t shard_size,
                                   std::span<T> scratch, Collectives collectives) {
  if (collectives == Collectives::ring)
    ring_reduce_scatter(comm, bucket, scratch);  // chapter 04's first half: our chunk is summed
  else
    mpi_reduce_scatter_in_place(comm, bucket, scratch);  // common/comm/typed_collectives.hpp
  return bucket.subspan(comm.rank() * shard_size, shard_size);
}

/// Collective: all-gathers padded bucket `bucket` (n + padding elements of T) from every rank's
/// shard (this rank's in place at [r s, (r+1) s)). ring: chapter 04's second half (it copies);
/// mpi: MPI_Allgather (float), through `scratch` (≥ s).
template <Element T>
void all_gather_bucket(Communicator& comm, std::span<T> bucket, std::span<T> scratch,
                       Collectives collectives) {
  if (collectives == Collectives::ring)
    ring_all_gather(comm, bucket);  // chapter 04's second half
  else
    mpi_all_gather_in_place(comm, bucket, scratch);
}

}  // namespace ringzero
