// layer_collectives: ZeRO-3's collectives on one Linear layer, queued on the communication
// thread. A layer's padded parameters or gradient (P_l = N s_l elements, layer_shard.hpp) is a
// bucket of N chunks of s_l, so the ring or MPI work is chapter 06's (shard.hpp);
// what is ZeRO-3's here: a reduce-scatter adds this rank's chunk of the mean into its gradient
// shard, so micro-steps accumulate there, and the desync check runs before every collective.
// That check is chapters 05-07's --check-collectives, on always: a collective per layer, per
// forward and backward, is easy to post one too many on one rank (a branch on its own data, a
// layer called twice); its 16 bytes per collective are part of this chapter's traffic
// (common/zero/layer_check.hpp, which also names the layers' collectives in the trace).
// Leaves out: when each collective is posted, and the buffers' lifetimes (zero3.hpp).
#pragma once

#include <cstdint>
#include <span>
#include <type_traits>

#include "chapters/06_zero1/shard.hpp"
#include "chapters/08_zero3/layer_shard.hpp"
#include "common/comm/comm_queue.hpp"
#include "common/driver/engine_description.hpp"
#include "common/precision/shard_buffers.hpp"
#include "common/zero/layer_check.hpp"
#include "common/zero/padded_buffer.hpp"

namespace ringzero {

/// The collectives of ZeRO-3 with element types T (parameters) and R (gradients), on the
/// layers of `layout`. Collective: every rank posts the same collectives in the same order.
template <Element T, Element R>
class LayerCollectives {
 public:
  /// comm and layout must outlive it. tracer: optional (comm_queue.hpp). device: where the
  /// engine's buffers live (the ring's chunk buffer goes there too).
  LayerCollectives(Communicator& comm, const LayerLayout& layout, Collectives collectives,
                   Tracer* tracer, Device device)
      : comm_(comm),
        layout_(layout),
        collectives_(collectives),
        queue_(comm, tracer, layer_naming(layout.layers), layer_desync_check(layout.layers)) {
    scratch_ = BufferOf<R>(largest_shard(shard_units(layout)), MemTag::comm_buffers,
                           device);  // (max s_l) a chunk
  }

  /// Queues layer l's all-gather: `layer` (P_l elements of E: the parameters' T, or fp32
  /// optimizer state) holds this rank's chunk in place; every chunk is there when the returned
  /// ticket is done.
  template <Element E>
  uint64_t all_gather(int l, LayerCollective kind, std::span<E> layer) {
    const BucketShard& s = layout_.buckets[l];
    return submit(l, kind, element_bytes<E>() * s.padded_size(), [this, layer] {
      all_gather_bucket(comm_, layer, scratch_as<E>(), collectives_);
    });
  }

  /// Queues layer l's reduce-scatter of `layer` (its gradient, P_l elements of R): this rank's
  /// chunk of the sum, made the mean (mean_of_sum<T, R>), is added to `shard` (s_l elements).
  uint64_t reduce_scatter(int l, std::span<R> layer, std::span<R> shard) {
    const BucketShard& s = layout_.buckets[l];
    return submit(
        l, kReduceScatter, element_bytes<R>() * s.padded_size(), [this, &s, layer, shard] {
          std::span<R> sum = reduce_scatter_bucket(comm_, layer, s.shard_size, scratch_.span(),
                                                   collectives_);  // chapter 06's
          mean_of_sum<T, R>(sum, comm_.world_size());  // fp32: ÷N; 16 bits: pre-divided
          add_into(shard, std::span<const R>(sum));
        });
  }

  /// Waits for `ticket` (traced on the main track); rethrows a collective's error.
  void wait(uint64_t ticket) { queue_.wait(ticket); }
  void wait_all() { queue_.wait_all(); }
  /// Bytes of the ring's chunk buffer (the ledger's formula line).
  int64_t scratch_bytes() const { return scratch_.bytes(); }

 private:
  // Queues job() on the communication thread, behind the desync check (the queue runs it).
  template <class Job>
  uint64_t submit(int l, LayerCollective kind, int64_t bytes, Job job) {
    return queue_.submit(
        {.kind = kind, .unit = l, .elements = layout_.buckets[l].padded_size(), .bytes = bytes},
        job);
  }
  // The scratch as E (MPI's collectives want their input or output apart): ours when E is R;
  // empty otherwise (16-bit runs use the ring, which needs none for an all-gather).
  template <class E>
  std::span<E> scratch_as() {
    if constexpr (std::is_same_v<E, R>)
      return scratch_.span();
    else
      return {};
  }

  Communicator& comm_;
  const LayerLayout& layout_;
  Collectives collectives_;
  BufferOf<R> scratch_;
  CommQueue queue_;  // last: drained first, while everything above lives
};

}  // namespace ringzero
