// layer_collectives: ZeRO-3's collectives on one Linear layer, queued on the communication
// thread. A layer's padded parameters or gradient (P_l = N s_l elements, layer_shard.hpp) is a
// bucket of N chunks of s_l, so the ring or MPI work is chapter 06's (bucket_collectives.hpp);
// what is ZeRO-3's here: a reduce-scatter adds this rank's chunk of the mean into its gradient
// shard, so micro-steps accumulate there, and the desync check runs before every collective.
// The engine (zero3.hpp) decides when.
//
// The desync check is chapters 05-07's --check-collectives (common/checks/collective_check.hpp:
// before its data, each collective swaps a 16-byte header, its sequence number, layer, kind and
// size, with the ring neighbours), on always: ZeRO-3 makes a collective per layer, per forward
// and backward, so a rank that runs one layer more than the others (a branch on its own data, a
// layer called twice) posts one collective more; paired with another rank's collective of
// another layer, that is a hang or, for two layers of the same size, silently wrong weights.
// Its 16 bytes per collective are counted as "desync_check", part of this chapter's traffic.
// Leaves out: prefetching decisions and buffer lifetimes (zero3.hpp); divergences that post the
// same collectives (a rank that skips a layer's compute but not its hooks computes garbage, in
// step).
#pragma once

#include <cstdint>
#include <cstdio>
#include <functional>
#include <span>
#include <string>
#include <type_traits>

#include "chapters/06_zero1/bucket_collectives.hpp"
#include "chapters/08_zero3/layer_shard.hpp"
#include "common/checks/collective_check.hpp"
#include "common/comm/comm_queue.hpp"
#include "common/precision/shard_buffers.hpp"
#include "common/zero/padded_buffer.hpp"

namespace ringzero {

/// What a ZeRO-3 collective is for; part of the desync header.
enum LayerCollective : uint32_t { kForwardGather, kBackwardGather, kReduceScatter, kStateGather };

/// A desync header in words, e.g. "ZeRO-3 collective #9 is the all-gather of layer 2 for its
/// forward (1234 elements)". h.kind is a LayerCollective; h.id a layer of `layout`, named as
/// state_dict() names it (another rank's header may hold any id: out of range, shown as "#id").
inline std::string describe_layer_collective(const CollectiveHeader& h, const LayerLayout& layout) {
  static const char* what[] = {
      "the all-gather of layer %s for its forward", "the all-gather of layer %s for its backward",
      "the reduce-scatter of layer %s's gradient", "the all-gather of layer %s for a checkpoint"};
  const std::string layer =
      h.id < layout.layers.size() ? layout.layers[h.id]->name() : "#" + std::to_string(h.id);
  char out[192];
  const int n = std::snprintf(out, sizeof out, "ZeRO-3 collective #%u is ", h.seq);
  std::snprintf(out + n, sizeof out - n,
                h.kind < 4 ? what[h.kind] : "an unknown collective on layer %s", layer.c_str());
  return std::string(out) + " (" + std::to_string(h.size) + " elements)";
}

/// The desync check of a ZeRO-3 engine's queue (comm_queue.hpp runs it right before each
/// collective): on, always, counted as "desync_check"; each header is (seq, layer,
/// LayerCollective, P_l), described by describe_layer_collective. `layout` must outlive the
/// queue. World size 1: nothing to check.
inline CollectiveSequence desync_check(const LayerLayout& layout) {
  return CollectiveSequence(
      /*enabled=*/true, "desync_check",
      [&layout](const CollectiveHeader& h) { return describe_layer_collective(h, layout); },
      "Every rank must run the same layers in the same order: a layer run on some ranks only (a "
      "branch on one rank's data, a layer called twice) pairs different collectives across "
      "ranks, a hang or silently wrong weights");
}

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
        queue_(comm, tracer, {layer_collective_name(layout), "post", "zero3"},
               desync_check(layout)) {
    int64_t largest_chunk = 0;
    for (const BucketShard& s : layout.buckets)
      largest_chunk = std::max(largest_chunk, s.shard_size);
    scratch_ = BufferOf<R>(largest_chunk, MemTag::comm_buffers, device);  // (max s_l) a chunk
  }

  /// Queues layer l's all-gather: `layer` (P_l elements of E: the parameters' T, or fp32
  /// optimizer state) holds this rank's chunk in place; every chunk is there when the returned
  /// ticket is done.
  template <Element E>
  uint64_t all_gather(int l, LayerCollective kind, std::span<E> layer) {
    const BucketShard& s = layout_.buckets[l];
    return submit(l, kind, element_bytes<E>() * s.padded_size(), [this, &s, layer] {
      all_gather_bucket(comm_, layer, s.shard_size, scratch_as<E>(), collectives_);
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
  // The trace's names: "all_gather 2 (forward)", "reduce_scatter 4", ...
  static std::function<std::string(uint32_t, int)> layer_collective_name(
      const LayerLayout& layout) {
    return [&layout](uint32_t kind, int l) {
      static const char* labels[] = {"all_gather %s (forward)", "all_gather %s (backward)",
                                     "reduce_scatter %s", "all_gather %s (state)"};
      char label[96];
      std::snprintf(label, sizeof label, labels[kind % 4], layout.layers[l]->name().c_str());
      return std::string(label);
    };
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
