// Shards: which elements of the model each rank owns, in a layout padded per bucket.
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
// Why per bucket (as DeepSpeed's flat partitions) rather than per parameter (as simple from-scratch
// ZeRO):
//  - chapter 04's ring cuts n elements into chunks of ceil(n / N) and rank r reduces chunk r.
//    On the padded bucket every chunk is exactly s = ceil(n / N), so each real element lands
//    in the same chunk, and is summed in the same ring order, as in chapter 05's all-reduce of
//    the unpadded bucket: chapters 06 and 07 are bitwise equal to chapter 05. Per-parameter
//    padding moves chunk boundaries, hence summation orders: equal only within a tolerance;
//  - one collective per bucket, not per parameter: the bucket sizes chapter 05 tuned for;
//  - equal shard sizes are what equal-block collectives need (MPI_Reduce_scatter_block,
//    MPI_Allgather, NCCL's reduce_scatter and all_gather), and give each rank the same work.
// Invariants: padding is allocated zero and nothing ever writes it (backward writes only
// parameters, the optimizer gets only the real elements of a shard, a reduce-scatter adds
// zeros to zeros, an all-gather copies the owner's zeros), so it adds nothing to norms. A
// bucket smaller than N leaves some ranks owning only padding; they still join every
// collective, with an empty optimizer. Padding is counted under its own ledger tag.
// Also: a bucket's reduce-scatter and all-gather (ring or MPI), and clip_grad_norm over the
// shards, shared by chapters 06-08.
// Leaves out: parameter sharding (ZeRO-3 keeps only the shard of the parameters too).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "chapters/04_ring_allreduce/ring.hpp"
#include "chapters/05_ddp_buckets/buckets.hpp"
#include "common/dist.hpp"
#include "common/ledger.hpp"
#include "common/metrics.hpp"
#include "common/nn.hpp"
#include "common/safetensors.hpp"
#include "common/train.hpp"

namespace ringzero {

/// One bucket of the padded layout, and this rank's shard of it.
struct BucketShard {
  int64_t offset = 0;         ///< first element in the model's unpadded layout (Bucket::offset)
  int64_t size = 0;           ///< n, real elements
  int64_t padding = 0;        ///< (N − n mod N) mod N
  int64_t padded_offset = 0;  ///< first element in the padded flat buffer
  int64_t shard_size = 0;     ///< s = (n + padding) / N, the same on every rank
  int64_t shard_offset =
      0;             ///< this bucket's shard in a rank's shard buffer (Σ s of earlier buckets)
  int64_t real = 0;  ///< real elements in this rank's shard: clamp(n − r s, 0, s)
  std::vector<int64_t>
      segments;  ///< sizes of the parameter pieces in [r s, r s + real), memory order
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
    const int64_t lo = rank * s.shard_size,
                  hi = lo + s.real;  // this rank's real elements, bucket-local
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
  int64_t psi = 0;
  for (const Parameter* p : model.parameters()) psi += p->numel();
  layout.padded_total = psi + layout.padding_total;
  return layout;
}

/// The real elements rank `rank` owns: Σ over buckets of clamp(n − rank s, 0, s). Pure
/// arithmetic, so any rank can compute every rank's share (for the ledger's formula line).
inline int64_t shard_real_of(const ShardLayout& layout, int rank) {
  int64_t real = 0;
  for (const BucketShard& b : layout.buckets)
    real += std::clamp(b.size - rank * b.shard_size, int64_t{0}, b.shard_size);
  return real;
}

/// A Buffer of `size` elements whose last `padding` are counted under MemTag::padding, the
/// rest under `tag`. The ledger moves are ordered so that no tag's peak ever includes bytes
/// that belong to another tag.
class PaddedBuffer {
 public:
  PaddedBuffer() = default;
  PaddedBuffer(int64_t size, int64_t padding, MemTag tag) : padding_(padding) {
    Ledger::get().add(tag, -4 * padding);  // the Buffer adds all `size` to `tag` ...
    buffer_ = Buffer(size, tag);
    Ledger::get().add(MemTag::padding, 4 * padding);  // ... of which `padding` are padding
  }
  ~PaddedBuffer() { release(); }
  PaddedBuffer(PaddedBuffer&& o) noexcept
      : buffer_(std::move(o.buffer_)), padding_(std::exchange(o.padding_, 0)) {}
  PaddedBuffer& operator=(PaddedBuffer&& o) noexcept {
    if (this != &o) {
      release();
      buffer_ = std::move(o.buffer_);
      padding_ = std::exchange(o.padding_, 0);
    }
    return *this;
  }
  PaddedBuffer(const PaddedBuffer&) = delete;
  PaddedBuffer& operator=(const PaddedBuffer&) = delete;

  float* data() { return buffer_.data(); }
  int64_t size() const { return buffer_.size(); }
  std::span<float> span() { return buffer_.span(); }
  std::span<const float> span() const { return buffer_.span(); }
  /// Frees the memory now; the ledger drops it from both tags.
  void release() {
    if (buffer_.size() == 0) return;
    const MemTag tag = buffer_.tag();
    buffer_.release();
    Ledger::get().add(tag, 4 * padding_);
    Ledger::get().add(MemTag::padding, -4 * padding_);
    padding_ = 0;
  }

 private:
  Buffer buffer_;
  int64_t padding_ = 0;
};

/// Bytes each rank sends and receives per optimizer step: one reduce-scatter of the gradients
/// and one all-gather of the parameters, per padded bucket. With the ring every chunk is s, so
/// every rank moves 2 (N − 1) s elements per bucket: 2(N−1)/N · 4(Ψ + padding) bytes. With
/// MPI's collectives the counters see only the payload handed to MPI: the bucket to reduce
/// less our block, and our block to gather, N s per bucket (the wire traffic is MPI's).
inline TrafficTheory zero_traffic_theory(const ShardLayout& layout, int world_size, int64_t psi,
                                         const std::string& collectives) {
  TrafficTheory theory;
  const bool ring = collectives == "ring";
  for (int r = 0; r < world_size; ++r) {
    int64_t sent = 0, received = 0;
    for (const BucketShard& b : layout.buckets) {
      const int64_t n = b.padded_size(), s = b.shard_size;
      sent +=
          ring ? ring_reduce_scatter_sent(n, world_size, r) + ring_all_gather_sent(n, world_size, r)
               : (world_size - 1) * s + s;
      received += ring ? ring_reduce_scatter_received(n, world_size, r) +
                             ring_all_gather_received(n, world_size, r)
                       : s + (world_size - 1) * s;
    }
    theory.bytes_sent.push_back(4 * sent);
    theory.bytes_received.push_back(4 * received);
  }
  const double N = world_size;
  const std::string counts = "; N = " + std::to_string(world_size) +
                             ", Ψ = " + std::to_string(psi) +
                             ", padding = " + std::to_string(layout.padding_total);
  theory.formula = ring ? "theory (ring reduce-scatter of gradients + ring all-gather of "
                          "parameters, per bucket): every rank "
                          "sends 2(N-1)/N·4Ψ = " +
                              human_bytes(2 * (N - 1) / N * 4.0 * static_cast<double>(psi)) +
                              " per step, as DDP; exactly 2(N-1)/N·4(Ψ + padding) = " +
                              human_bytes(static_cast<double>(theory.bytes_sent[0])) + counts
                        : "MPI_Reduce_scatter_block + MPI_Allgather: counters show the payload "
                          "handed to MPI, 4(Ψ + padding) = " +
                              human_bytes(static_cast<double>(theory.bytes_sent[0])) +
                              " per step, not its wire traffic" + counts;
  return theory;
}

/// Collective: reduce-scatters padded bucket `bucket` (n + padding) over the ranks; returns
/// this rank's shard, bucket[r s, (r+1) s), which then holds the sum over ranks (the rest of
/// the bucket holds partial sums). collectives "ring": chapter 04's first half, in place;
/// "mpi": MPI_Reduce_scatter_block, which wants the output apart, through `scratch` (≥ s).
inline std::span<float> reduce_scatter_bucket(Communicator& comm, std::span<float> bucket,
                                              int64_t shard_size, std::span<float> scratch,
                                              const std::string& collectives) {
  std::span<float> shard = bucket.subspan(comm.rank() * shard_size, shard_size);
  if (collectives == "ring") {
    ring_reduce_scatter(comm, bucket, scratch);  // chapter 04's first half: our chunk is summed
  } else {                                       // MPI wants the output apart from the input
    comm.reduce_scatter(bucket, scratch.first(shard_size));
    std::copy_n(scratch.data(), shard_size, shard.begin());
  }
  return shard;
}

/// Collective: all-gathers padded bucket `bucket` (n + padding) from every rank's shard (this
/// rank's in place at [r s, (r+1) s)). collectives "ring": chapter 04's second half; "mpi":
/// MPI_Allgather, which wants the input apart, through `scratch` (≥ s).
inline void all_gather_bucket(Communicator& comm, std::span<float> bucket, int64_t shard_size,
                              std::span<float> scratch, const std::string& collectives) {
  if (collectives == "ring") {
    ring_all_gather(comm, bucket);  // chapter 04's second half
  } else {                          // MPI wants the input apart from the output
    std::span<float> shard = bucket.subspan(comm.rank() * shard_size, shard_size);
    std::copy(shard.begin(), shard.end(), scratch.data());
    comm.all_gather(scratch.first(shard_size), bucket);
  }
}

/// Collective, after the gradients are reduced: scales `shards` (this rank's real gradient
/// elements, every bucket or layer) so that the global L2 norm of the gradient is at most
/// max_norm (torch.nn.utils.clip_grad_norm_, with its 1e-6); returns the norm before
/// clipping. Every rank receives every rank's Σ g² over its shards (exact: the others add
/// zeros) and adds them in rank order, so every rank gets the same norm. It equals the
/// unsharded norm up to float64 rounding (another summation order, ~1e-16 relative); the float
/// clip coefficient is then the same bit for bit unless that rounding straddles a float
/// boundary. Padding is zero and left out, so each element counts once. Chapters 06-08.
inline double clip_sharded_grad_norm(Communicator& comm,
                                     const std::vector<std::span<float>>& shards, float max_norm) {
  std::vector<double> sums(static_cast<size_t>(comm.world_size()), 0.0);  // (N) each rank's Σ g²
  for (std::span<float> shard : shards) sums[comm.rank()] += sum_of_squares(shard);
  comm.all_reduce_metrics(sums);
  double total = 0;
  for (double v : sums) total += v;
  const double norm = std::sqrt(total);
  const float coef = clip_coefficient(norm, max_norm);
  if (coef < 1.0f)
    for (std::span<float> shard : shards) scale_in_place(shard, coef);
  return norm;
}

/// Collective, for the equivalence tests (the comm counters count its traffic): the AdamW
/// state of `optimizers` (optimizers[b] over this rank's real elements of bucket b) gathered
/// into the unpadded names and shapes, as "<param>.exp_avg", "<param>.exp_avg_sq" and
/// "<param>.step" (shape (1)). Errors: an optimizer that is not AdamW; pieces of a parameter
/// whose step counts differ.
inline std::map<std::string, NamedTensor> gather_optimizer_state(
    Communicator& comm, const Model& model, const ShardLayout& layout,
    const std::vector<Optimizer>& optimizers) {
  const auto& params = model.parameters();
  std::map<std::string, NamedTensor> out;
  std::vector<double> steps(3 * params.size(), 0.0);  // (P, 3) Σ step, Σ step², pieces
  for (int which = 0; which < 2; ++which) {
    Buffer full(layout.padded_total, MemTag::comm_buffers);  // (Ψ + padding) the state, gathered
    for (size_t b = 0; b < layout.buckets.size(); ++b) {
      const BucketShard& s = layout.buckets[b];
      const AdamW* adamw = optimizers[b].adamw();
      RZ_CHECK(adamw != nullptr, "optimizer state is saved for --optimizer adamw only");
      std::span<const float> state = which == 0 ? adamw->exp_avg() : adamw->exp_avg_sq();
      std::copy(state.begin(), state.end(),
                full.data() + s.padded_offset + comm.rank() * s.shard_size);
      ring_all_gather(comm, full.span().subspan(s.padded_offset, s.padded_size()));
      for (size_t k = 0; which == 0 && k < adamw->segment_steps().size(); ++k) {
        const auto t = static_cast<double>(adamw->segment_steps()[k]);
        double* st = &steps[3 * s.segment_params[k]];
        st[0] += t, st[1] += t * t, st[2] += 1;
      }
    }
    for (size_t i = 0; i < params.size(); ++i) {
      const float* v = full.data() + layout.param_offset[i];
      out[params[i]->name() + (which == 0 ? ".exp_avg" : ".exp_avg_sq")] = {
          params[i]->shape(), {v, v + params[i]->numel()}};
    }
  }
  comm.all_reduce_metrics(steps);
  for (size_t i = 0; i < params.size(); ++i) {
    const double* st = &steps[3 * i];
    RZ_CHECK(st[1] * st[2] == st[0] * st[0],
             "the pieces of " << params[i]->name() << " took different numbers of steps");
    out[params[i]->name() + ".step"] = {{1}, {static_cast<float>(st[0] / st[2])}};
  }
  return out;
}

}  // namespace ringzero
