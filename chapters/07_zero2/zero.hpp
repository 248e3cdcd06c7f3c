// ZeRO-2: chapter 06's ZeRO-1 with the gradients sharded too (Rajbhandari et al. 2020, §5.2,
// P_os+g). After chapter 06's reduce-scatter a rank reads only its shard of a bucket's
// gradient; ZeRO-2 keeps only that shard (4Ψ/N). A bucket's full gradient exists from the
// backward of its first layer until its reduce-scatter is done:
//
//   main:  alloc b0 ▶ backward 4 ─▶ alloc b1 ▶ backward 2 ──▶ backward 0 ─▶ finalize ▶ free b1
//   comm:                     └ reduce_scatter b0 → shard ┘   └ reduce_scatter b1 → shard ┘
//
// The pre-backward hook of the first layer that writes into a bucket allocates it (zeros);
// its reduce-scatter copies this rank's chunk, divided by world_size, into the gradient shard.
// Memory is handed back on the main thread: allocating bucket b frees bucket b − 2 (waiting
// for it if needed), finalize_backward() frees the rest. So at most two buckets exist at once
// (DeepSpeed's double-buffered reduce bucket): model states 4Ψ + (4Ψ + 8Ψ)/N plus two buckets.
// Same traffic, same sums: bit for bit chapters 05 and 06. With K > 1 the buckets stay through
// set_require_sync(false) (no_sync) and accumulate as in DDP (the full 4Ψ lives again: one
// reduce per step); DeepSpeed reduce-scatters every micro-step instead (4Ψ/N, K times the
// traffic, not bitwise).
// Every rank stays in step by chapter 05's readiness.hpp ("Rules that keep every rank in
// step", "Unused parameters"), reduce-scatter in place of all-reduce; --check-collectives checks
// each reduce-scatter across ranks first (common/comm_queue.hpp). Leaves out: what chapter
// 06's zero.hpp leaves out.
//
// Written over the element types as chapter 06 (common/shard_precision.hpp): in 16 bits the
// parameters and each bucket in flight hold 2 bytes per element, and the gradient shard holds
// the reduced gradient in R (2 bytes, or 4 with --reduce-dtype fp32): model states 2Ψ + (2 +
// 12)Ψ/N plus two 16-bit buckets; the same bytes per step and the same sums as chapter 06.
#pragma once

#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "chapters/05_ddp_buckets/buckets.hpp"
#include "chapters/05_ddp_buckets/readiness.hpp"
#include "chapters/06_zero1/bucket_collectives.hpp"
#include "chapters/06_zero1/shard.hpp"
#include "chapters/06_zero1/options.hpp"
#include "common/collectives.hpp"
#include "common/comm_queue.hpp"
#include "common/dist.hpp"
#include "common/engine_description.hpp"
#include "common/padded_buffer.hpp"
#include "common/shard_precision.hpp"
#include "common/shard_state.hpp"
#include "common/typed_collectives.hpp"
#include "common/train.hpp"
#include "common/zero_memory.hpp"

namespace ringzero {

/// ZeRO stage 2 (P_os+g) on chapter 05's buckets: every rank holds every parameter (padded per
/// bucket), the gradient and optimizer state of its shard, and at most two full buckets of
/// gradient while backward runs. T, R: as Zero1's (the gradient shard holds R). Collective:
/// every rank calls its methods in the same order.
template <Element T = float, Element R = T>
class Zero2 {
 public:
  using Options = ZeroOptions;

  /// Plans the buckets and their shards, checks the plan is the same on every rank
  /// (collective), builds this rank's optimizer for its shard (--optimizer of `config`; in 16
  /// bits the fp32 master weights, read from the model first), moves the parameters of `model`
  /// into a padded flat buffer of T and frees its gradients (Model::num_parameters() still reads
  /// Ψ, fixed at construction), keeps a gradient shard of R, hooks every parameter and every
  /// Linear layer (pre-backward: allocate its buckets). comm and model must outlive the Zero2;
  /// the layer hooks stay on the model but do nothing once it is gone. Errors: --collectives
  /// mpi in 16 bits (MPI has no bf16/fp16 sum).
  Zero2(Communicator& comm, Model& model, const TrainConfig& config, Options options)
      : comm_(comm),
        model_(model),
        options_(options),
        buckets_(plan_buckets(parameter_sizes(model), mib_to_bytes(options.bucket_cap_mb),
                              mib_to_bytes(options.first_bucket_cap_mb))),
        layout_(plan_shards(model, buckets_, comm.rank(), comm.world_size())),
        psi_(model.num_parameters()),
        optimizer_(model, config, shard_pieces(layout_.buckets, comm.rank()), comm.world_size()) {
    optimizer_.check_types<T, R>();                                   // the flags' precision
    check_collectives_for<T>(options.collectives, config.precision);  // mpi: fp32 only
    check_bucket_plans_match(comm, buckets_);
    const auto& params = model.parameters();
    int64_t largest_chunk = 0, largest_bucket = 0;
    for (const BucketShard& s : layout_.buckets) {
      largest_chunk = std::max(largest_chunk, s.shard_size);
      largest_bucket = std::max(largest_bucket, s.padded_size());
    }
    // (s) the collective's incoming chunk; with R wider than T, the widened bucket.
    reduce_ = ShardReduce<T, R>(comm.world_size(), largest_bucket, largest_chunk);
    // Every parameter moves to its padded place; a parameter has gradient storage only while
    // its bucket is in flight (allocate_bucket).
    grad_shard_ = PaddedBufferOf<R>(layout_.shard_total, layout_.shard_total - layout_.shard_real,
                                    MemTag::gradients);
    params_ =
        PaddedBufferOf<T>(layout_.padded_total, layout_.padded_total - psi_, MemTag::parameters);
    binding_ = std::make_unique<ParameterBinding<T>>(model, params_.span(), layout_.param_offset);
    bucket_grads_.resize(buckets_.size());
    tickets_.assign(buckets_.size(), 0);
    for (Linear* layer : model.linear_layers()) {  // a layer's backward needs its buckets' memory
      std::vector<int> mine;
      for (Parameter* p : layer->parameters())
        mine.push_back(
            static_cast<int>(std::find(params.begin(), params.end(), p) - params.begin()));
      layer->add_pre_backward_hook([alive = alive_, mine](Module&) {
        if (*alive)
          for (int i : mine) (*alive)->allocate_bucket((*alive)->readiness_->bucket_of(i));
      });
    }
    readiness_.emplace(model, buckets_, options.find_unused_parameters, "reduce-scattered",
                       [this](int b) { launch(b); }, [this] { comm_queue_.wait_all(); });
  }

  /// Waits for the communication thread and removes the hooks (the layer hooks go quiet).
  ~Zero2() { *alive_ = nullptr; }
  Zero2(const Zero2&) = delete;
  Zero2& operator=(const Zero2&) = delete;

  Communicator& comm() const { return comm_; }
  const std::vector<Bucket>& buckets() const { return buckets_; }
  const ShardLayout& layout() const { return layout_; }
  /// What this engine is, as data: stage, buckets, collectives, padding (zero_io.cpp).
  EngineDescription describe() const;
  /// The --explain-buckets table (common/bucket_tools.hpp).
  std::string explain() const {
    return explain_buckets(buckets_, model_, options_.bucket_cap_mb, options_.first_bucket_cap_mb,
                           "reduce-scattered");
  }

  /// Model-state bytes each rank should hold between steps (zero_io.cpp).
  std::vector<int64_t> model_states_bytes() const;
  /// The most bytes of full bucket gradients alive at once, K = 1 (zero_io.cpp).
  int64_t in_flight_peak_bytes() const;
  /// The ledger's formula line: ZeRO-2's formula, and the exact bytes of every rank (zero_io.cpp).
  std::string ledger_formula() const;

  /// What every rank should send and receive per optimizer step (bucket_collectives.hpp):
  /// sizeof(R) bytes per element on the reduce-scatter, sizeof(T) on the all-gather.
  TrafficTheory traffic_theory() const {
    return zero_traffic_theory(layout_, comm_.world_size(), psi_, options_.collectives,
                               element_bytes<R>(), element_bytes<T>());
  }

  /// The padded parameters, every bucket (tests; common/shard_state.hpp saves and loads them).
  std::span<T> parameter_storage() { return params_.span(); }
  /// This rank's optimizer: its shard's state, the loss scale, the backward seed.
  ShardOptimizer& optimizer() { return optimizer_; }
  const ShardOptimizer& optimizer() const { return optimizer_; }

  /// false: the next backwards accumulate locally and send nothing (PyTorch's no_sync());
  /// true: the next backward reduce-scatters (chapter 05's readiness.hpp).
  void set_require_sync(bool sync) { readiness_->set_require_sync(sync); }

  /// Drops every gradient: frees the buckets (they come back as zeros) and zeroes the shard.
  void zero_grad() {
    comm_queue_.wait_all();
    for (size_t b = 0; b < bucket_grads_.size(); ++b) free_bucket(b);
    std::fill(grad_shard_.data(), grad_shard_.data() + grad_shard_.size(), R{});
  }

  /// After backward, before the optimizer step (PyTorch runs this as backward's final
  /// callback): handles unused parameters, waits until every bucket is reduce-scattered and
  /// this rank's shard holds the mean. Does nothing when require_sync is false. Errors: unused
  /// parameters without find_unused_parameters (names them), a failed reduce-scatter.
  void finalize_backward() {
    if (!readiness_->finalize_backward()) return;
    for (size_t b = 0; b < bucket_grads_.size(); ++b)
      free_bucket(b);  // reduced: only the shard stays
  }

  /// Collective, after finalize_backward(): this rank's optimizer updates the real elements of
  /// its shard of every bucket (clipped with --clip-grad-norm over every rank's shards first:
  /// common/sharded_clip.hpp), then each bucket's parameters are all-gathered on the comm thread
  /// (bucket b's while the optimizer works on b + 1). Returns when every rank holds every
  /// parameter; false, on every rank, when fp16's loss scaler found an overflow on some rank
  /// (nothing updated, nothing gathered).
  bool step() {
    std::vector<std::span<R>> grads;  // (buckets) this rank's reduced gradient shard
    for (size_t b = 0; b < layout_.buckets.size(); ++b) grads.push_back(shard_grads(b));
    if (!optimizer_.prepare(comm_, grads)) return false;  // fp16: an overflow on some rank
    // BEGIN EXERCISE 06.1 (ZeRO-1's step, copied forward)
    for (size_t b = 0; b < layout_.buckets.size(); ++b) {
      optimizer_.step(b, shard_params(b), shard_grads(b));
      const BucketShard& s = layout_.buckets[b];
      std::span<T> bucket = params_.span().subspan(s.padded_offset, s.padded_size());
      comm_queue_.submit({.kind = CollectiveSequence::kAllGather, .unit = static_cast<int>(b),
                          .bytes = element_bytes<T>() * s.padded_size(), .checked = false},
                         [this, &s, bucket] {
                           all_gather_bucket(comm_, bucket, s.shard_size, reduce_.gather_scratch(),
                                             options_.collectives);  // bucket_collectives.hpp
                         });
    }
    comm_queue_.wait_all();
    // END EXERCISE 06.1
    return true;
  }

  /// Collective: one bucket's padded fp32 buffer all-gathered with the ring (rank r's shard at
  /// r·s; any --collectives), for the states common/shard_state.hpp gathers whole.
  void gather_state(size_t, std::span<float> bucket) { ring_all_gather(comm_, bucket); }
  /// Elements of the padding that are not zero: must be 0 (common/shard_state.hpp).
  int64_t nonzero_padding() const {
    return count_nonzero_padding(describe(), comm_.rank(), params_.span(), false) +
           count_nonzero_padding(describe(), comm_.rank(), grad_shard_.span(), true);
  }

 private:
  // This rank's shard of bucket b in a padded buffer, and its real elements in ours.
  std::span<T> shard_params(size_t b) {
    const BucketShard& s = layout_.buckets[b];
    return params_.span().subspan(s.padded_offset + comm_.rank() * s.shard_size, s.real);
  }
  std::span<R> shard_grads(size_t b) {
    return grad_shard_.span().subspan(layout_.buckets[b].shard_offset, layout_.buckets[b].real);
  }

  // Gives bucket b its full gradient (zeros) and points its parameters' grads into it, first
  // freeing bucket b − 2 and older: at most two buckets exist at a time. Main thread.
  void allocate_bucket(int b) {
    if (bucket_grads_[b].size() > 0) return;  // already there (this step, or accumulating)
    for (int old = 0; old + 1 < b; ++old)
      if (tickets_[old] != 0) free_bucket(old);
    const BucketShard& s = layout_.buckets[b];
    bucket_grads_[b] = PaddedBufferOf<T>(s.padded_size(), s.padding, MemTag::gradients);
    for (int p : buckets_[b].params)
      binding_->bind_grad(
          static_cast<size_t>(p),
          bucket_grads_[b].span().subspan(static_cast<size_t>(model_.offsets()[p] - s.offset),
                                          static_cast<size_t>(model_.parameters()[p]->numel())));
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
  // common/comm_queue.hpp); returns at once.
  void launch(int b) {
    allocate_bucket(b);  // only for a bucket no backward touched (find_unused_parameters)
    const BucketShard& s = layout_.buckets[b];
    tickets_[b] = comm_queue_.submit(
        {.kind = CollectiveSequence::kReduceScatter, .unit = b, .elements = s.padded_size(),
         .bytes = element_bytes<R>() * s.padded_size(), .params = std::ssize(buckets_[b].params)},
        [this, b, &s] {
          // BEGIN EXERCISE 07.1 (ZeRO-2: reduce-scatter in backward)
          std::span<R> shard =
              reduce_.reduce(bucket_grads_[b].span(), 0, [&](auto grads, auto scratch) {
                return reduce_scatter_bucket(
                    comm_, grads, s.shard_size, scratch,
                    options_.collectives);  // bucket_collectives.hpp: in R, the mean
              });
          std::copy(shard.begin(), shard.end(), grad_shard_.data() + s.shard_offset);  // all we keep
          // END EXERCISE 07.1
        });
  }

  Communicator& comm_;
  Model& model_;
  Options options_;
  std::vector<Bucket> buckets_;
  ShardLayout layout_;
  int64_t psi_;                   // Ψ
  ShardOptimizer optimizer_;      // this rank's shard: --optimizer, or fp32 masters (16 bits)
  ShardReduce<T, R> reduce_;      // --reduce-dtype: the collective's scratch (and widening)
  PaddedBufferOf<T> params_;      // (Ψ + padding) every parameter, padded per bucket
  PaddedBufferOf<R> grad_shard_;  // (Σ s) this rank's shard of every bucket's reduced gradient
  std::vector<PaddedBufferOf<T>> bucket_grads_;  // (buckets) a full gradient, while in flight
  std::vector<uint64_t> tickets_;  // (buckets) its reduce-scatter's comm-thread ticket; 0: none
  std::unique_ptr<ParameterBinding<T>> binding_;  // forward/backward's view of our buffers
  std::optional<BucketReadiness> readiness_;  // chapter 05's: when a bucket is launched
  friend struct BucketOrderFault;  // tests/tools/rank_fault.cpp: a rank out of order
  std::shared_ptr<Zero2*> alive_ =
      std::make_shared<Zero2*>(this);  // what the layer hooks reach us by
  CommQueue comm_queue_{comm_, options_.tracer, bucket_naming("zero")};  // last: drained first
};

}  // namespace ringzero
