// ZeRO-2: chapter 06's ZeRO-1 with the gradients sharded too (Rajbhandari et al. 2020, §5.2,
// P_os+g). After chapter 06's reduce-scatter a rank reads only its shard of a bucket's
// gradient; ZeRO-2 keeps only that shard (4Ψ/N). A bucket's full gradient exists from the
// backward of its first layer until its reduce-scatter is done:
//
//   main:  alloc b0 ▶ backward 4 ─▶ alloc b1 ▶ backward 2 ──▶ backward 0 ─▶ finalize ▶ free b0 b1
//   comm:                     └ reduce_scatter b0 → shard ┘   └ reduce_scatter b1 → shard ┘
//
// The pre-backward hook of the first layer that writes into a bucket allocates it (zeros);
// its reduce-scatter copies this rank's chunk, divided by world_size, into the gradient shard.
// Memory is handed back on the main thread: allocating bucket b frees b − 2 and older (waiting
// for them if needed), finalize_backward() frees the rest. So at most two buckets exist at once
// (DeepSpeed's double-buffered reduce bucket): model states 4Ψ + (4Ψ + 8Ψ)/N plus two buckets.
// Same traffic, same sums: bit for bit chapters 05 and 06. With K > 1 the buckets stay through
// set_require_sync(false) (no_sync) and accumulate as in DDP (the full 4Ψ lives again: one
// reduce per step); DeepSpeed reduce-scatters every micro-step instead (4Ψ/N, K times the
// traffic, not bitwise).
//
// A new file, not a diff of chapter 06's zero.hpp: Zero2 extends Zero1 and uses its step,
// buckets, shards and readiness (chapter 05's) as they are; it overrides where the gradients
// are kept: zero_grad, finalize_backward, the gradient shard, the reduce-scatter's job. Element
// types as chapter 06's (the gradient shard holds R; 16 bits: docs/mixed-precision.md, "ZeRO-1
// and ZeRO-2 in 16 bits"). Leaves out: what chapter 06's zero.hpp leaves out.
#pragma once

#include <span>
#include <vector>

#include "chapters/06_zero1/zero.hpp"
#include "common/driver/engine_description.hpp"
#include "common/zero/padded_buffer.hpp"

namespace ringzero {

/// ZeRO stage 2 (P_os+g) on chapter 05's buckets: every rank holds every parameter (padded per
/// bucket), the gradient and optimizer state of its shard, and at most two full buckets of
/// gradient while backward runs. T, R: as Zero1's (the gradient shard holds R). Collective:
/// every rank calls its methods in the same order.
template <Element T = float, Element R = T>
class Zero2 : public Zero1<T, R> {
  using Base = Zero1<T, R>;
  // Zero1's members we use, by name (a template's base members are not found unqualified).
  using Base::binding_, Base::buckets_, Base::comm_, Base::comm_queue_, Base::layout_, Base::model_,
      Base::optimizer_, Base::options_, Base::readiness_, Base::reduce_;

 public:
  /// Zero1 without its gradients (the buckets, the shards, this rank's optimizer, the padded
  /// parameters), plus a gradient shard of R and a pre-backward hook on every Linear layer that
  /// allocates its buckets (removed with it). comm and model must outlive it. Errors: Zero1's.
  Zero2(Communicator& comm, Model& model, const TrainConfig& config, ZeroOptions options)
      : Base(comm, model, config, options, /*full_gradients=*/false) {
    grad_shard_ = PaddedBufferOf<R>(layout_.shard_total, layout_.shard_total - layout_.shard_real,
                                    MemTag::gradients, model.device());
    bucket_grads_.resize(buckets_.size());
    tickets_.assign(buckets_.size(), 0);
    for (Linear* layer : model.linear_layers()) {  // a layer's backward needs its buckets' memory
      std::vector<int> mine = model.parameter_indices(*layer);
      hooks_.pre_backward(*layer, [this, mine](Module&) {
        for (int i : mine) allocate_bucket(readiness_->bucket_of(i));
      });
    }
  }

  /// Stops the communication thread (its jobs write our buffers: Zero1's comm_queue_ would
  /// stop only after our members are gone).
  ~Zero2() override { comm_queue_.stop(); }

  /// What this engine is, as data: Zero1's buckets, shards and collectives, stage 2, and at most
  /// two buckets of T in flight (one micro-step per step: the largest two consecutive buckets).
  EngineDescription describe() const {
    EngineDescription d = Base::describe();
    d.zero_stage = 2;
    d.max_in_flight = 2;  // allocate_bucket frees b − 2; the peak: engine_description.hpp
    d.in_flight_peak_bytes =
        in_flight_peak_bytes(d.units, d.world_size, d.max_in_flight, element_bytes<T>());
    return d;
  }

  /// Model-state bytes each rank holds between steps, one entry per rank: p per element of the
  /// padded parameters (Ψ + padding), sizeof(R) per element of its gradient shard (Σ s), K per
  /// real element of its shard; the buckets in flight come on top during backward. fp32: 4, 4
  /// and K of --optimizer (AdamW 8); 16 bits: 2, 2 (4 with --reduce-dtype fp32) and 12.
  std::vector<int64_t> model_states_bytes() const {
    const StateBytes b = optimizer_.state_bytes();
    std::vector<int64_t> bytes;
    for (int r = 0; r < comm_.world_size(); ++r)
      bytes.push_back(static_cast<int64_t>(b.param) * layout_.padded_total +
                      static_cast<int64_t>(element_bytes<R>()) * layout_.shard_total +
                      static_cast<int64_t>(b.optimizer) * shard_real_of(layout_, r));
    return bytes;
  }

  /// Drops every gradient: frees the buckets (they come back as zeros) and zeroes the shard.
  void zero_grad() override {
    comm_queue_.wait_all();
    for (size_t b = 0; b < bucket_grads_.size(); ++b) free_bucket(b);
    zero_elements(grad_shard_.span());
  }

  /// Chapter 05's readiness, as Zero1's (unused parameters, every bucket reduce-scattered), then
  /// frees the buckets: only the shard stays. Does nothing when require_sync is false.
  void finalize_backward() override {
    if (!readiness_->finalize_backward()) return;
    for (size_t b = 0; b < bucket_grads_.size(); ++b) free_bucket(b);
  }

  /// The gradient storage: the shard of every bucket, one after the other (shard_state.hpp).
  std::span<R> gradient_storage() { return grad_shard_.span(); }
  /// The reduced gradient of our shard of bucket b: what the reduce-scatter copied out.
  std::span<R> shard_grads(size_t b) override {
    return grad_shard_.span().subspan(layout_.buckets[b].shard_offset, layout_.buckets[b].real);
  }

 private:
  // Gives bucket b its full gradient (zeros) and points its parameters' grads into it, first
  // freeing bucket b − 2 and older: at most two buckets exist at a time. Main thread.
  void allocate_bucket(int b) {
    if (bucket_grads_[b].size() > 0) return;  // already there (this step, or accumulating)
    for (int old = 0; old + 1 < b; ++old)
      if (tickets_[old] != 0) free_bucket(old);
    const BucketShard& s = layout_.buckets[b];
    bucket_grads_[b] =
        PaddedBufferOf<T>(s.padded_size(), s.padding, MemTag::gradients, model_.device());
    for (int p : buckets_[b].params)  // at its place in the bucket
      binding_->bind_grad(static_cast<size_t>(p), bucket_grads_[b].span(),
                          model_.offsets()[p] - s.offset);
  }

  // Waits until bucket b is reduced (if it was launched), then frees its full gradient.
  void free_bucket(size_t b) {
    if (tickets_[b] != 0) comm_queue_.wait(tickets_[b]);
    tickets_[b] = 0;
    if (bucket_grads_[b].size() == 0) return;
    bucket_grads_[b].release();
    for (int p : buckets_[b].params) binding_->bind_grad(static_cast<size_t>(p), {});
  }

  // Queues bucket b's reduce-scatter on the communication thread (checked and traced there:
  // common/comm/comm_queue.hpp); returns at once.
  void launch(int b) override {
    allocate_bucket(b);  // only for a bucket no backward touched (find_unused_parameters)
    const BucketShard& s = layout_.buckets[b];
    tickets_[b] = comm_queue_.submit(
        {.kind = CollectiveSequence::kReduceScatter, .unit = b, .elements = s.padded_size(),
         .bytes = element_bytes<R>() * s.padded_size(), .params = std::ssize(buckets_[b].params)},
        [this, b, &s] {
          // BEGIN EXERCISE 07.1 (ZeRO-2: reduce-scatter in backward)
          std::span<R> shard =
              reduce_.reduce(bucket_grads_[b].span(), 0, [&](auto grads, auto scratch) {
                return reduce_scatter_bucket(comm_, grads, s.shard_size, scratch,
                                             options_.collectives);  // shard.hpp: in R, the mean
              });
          // all we keep: this rank's shard, at its place in grad_shard_
          copy_elements(shard, grad_shard_.span().subspan(s.shard_offset, shard.size()));
          // END EXERCISE 07.1
        });
  }

  PaddedBufferOf<R> grad_shard_;  // (Σ s) this rank's shard of every bucket's reduced gradient
  std::vector<PaddedBufferOf<T>> bucket_grads_;  // (buckets) a full gradient, while in flight
  std::vector<uint64_t> tickets_;  // (buckets) its reduce-scatter's comm-thread ticket; 0: none
  ModuleHooks hooks_;              // the layers' hooks, removed with us (common/core/nn.hpp)
  friend struct BucketOrderFault;  // tests/tools/rank_fault.cpp: a rank out of order
};

}  // namespace ringzero
