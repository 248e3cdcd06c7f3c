// ZeRO-1: chapter 05's DDP with the optimizer state sharded (Rajbhandari et al. 2020, §5.1, P_os).
//
// In DDP every rank keeps Adam's exp_avg and exp_avg_sq for every parameter (8Ψ bytes) and
// takes the same optimizer step on them: N copies of the same state and work. ZeRO-1 cuts every
// bucket into N shards (shard.hpp): a rank keeps optimizer state for its shard only and updates
// only its shard of the parameters. A ring all-reduce is a reduce-scatter then an all-gather
// (chapter 04); after the reduce-scatter each rank holds the summed gradient of exactly its
// shard, so the all-gather moves from the gradients to the updated parameters:
//
//   main:  backward 4 ─▶ backward 2 ──────▶ backward 0 ─▶ finalize ▶ step b0 ▶ step b1 ▶ wait
//   comm:         └ reduce_scatter b0 ┘       └ reduce_scatter b1 ┘  └ all_gather b0 ┘ └ b1 ┘
//
// The same bytes on the wire as DDP and the same sums in the same order (bit for bit,
// shard.hpp); 1/N of the optimizer state and work: model states 4Ψ + 4Ψ + 8Ψ/N. The gradients
// stay whole (keeping only the shard is chapter 07). Every rank stays in step by chapter 05's
// readiness.hpp, used as it is. Written once over the element types T (--precision) and R
// (--reduce-dtype); 16 bits: docs/mixed-precision.md, "ZeRO-1 and ZeRO-2 in 16 bits".
// Leaves out: what chapter 05 leaves out; overlapping the all-gather with the next forward.
#pragma once

#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "chapters/05_ddp_buckets/buckets.hpp"
#include "chapters/05_ddp_buckets/options.hpp"
#include "chapters/05_ddp_buckets/readiness.hpp"
#include "chapters/06_zero1/shard.hpp"
#include "common/comm/collectives.hpp"
#include "common/comm/comm_queue.hpp"
#include "common/comm/typed_collectives.hpp"
#include "common/driver/engine_description.hpp"
#include "common/driver/train.hpp"
#include "common/precision/shard_precision.hpp"
#include "common/report/dist.hpp"
#include "common/zero/padded_buffer.hpp"
#include "common/zero/zero_lesson.hpp"

namespace ringzero {

/// The options of chapters 06-07's engines: chapter 05's, unchanged (--collectives mpi:
/// MPI_Reduce_scatter_block and MPI_Allgather in place of MPI_Allreduce), and their flags.
using ZeroOptions = DDPOptions;
using ZeroBucketFlags = ZeroBucketFlagsOf<ZeroOptions>;  // common/zero/zero_lesson.hpp

/// ZeRO stage 1 (P_os) on chapter 05's buckets: every rank holds every parameter and gradient
/// (padded per bucket) and the optimizer state of its shard only. T, R: the element types
/// (above). Collective: every rank constructs one and calls its methods in the same order.
/// Chapter 07's Zero2 overrides the virtual members and hides describe, model_states_bytes and
/// gradient_storage: not virtual, so call those on the engine's own type.
template <Element T = float, Element R = T>
class Zero1 {
 public:
  using Options = ZeroOptions;

  /// Plans the buckets and their shards, checks the plan is the same on every rank
  /// (collective), builds this rank's optimizer for its shard (16 bits: the fp32 masters, read
  /// from the model first), moves the parameters into padded flat buffers of T (freeing the
  /// model's own) and hooks every parameter. comm and model must outlive it. full_gradients
  /// false: no gradient buffer (ZeRO-2 keeps its own). Errors: --collectives mpi in 16 bits.
  Zero1(Communicator& comm, Model& model, const TrainConfig& config, Options options,
        bool full_gradients = true)
      : comm_(comm),
        model_(model),
        options_(options),
        buckets_(plan_buckets(parameter_sizes(model), mib_to_bytes(options.bucket_cap_mb),
                              mib_to_bytes(options.first_bucket_cap_mb))),
        layout_(plan_shards(model, buckets_, comm.rank(), comm.world_size())),
        optimizer_(model, config, shard_pieces(layout_.buckets, comm.rank()), comm.world_size()) {
    optimizer_.check_types<T, R>();                                   // the flags' precision
    check_collectives_for<T>(options.collectives, config.precision);  // mpi: fp32 only
    check_bucket_plans_match(comm, buckets_);
    // Every buffer lives where the model does (host or --device); ShardReduce: shard_buffers.hpp.
    reduce_ =
        ShardReduce<T, R>(describe(), full_gradients ? layout_.shard_total : 0, model.device());
    const int64_t padding = layout_.padding_total;
    if (full_gradients)
      grads_ = PaddedBufferOf<T>(layout_.padded_total, padding, MemTag::gradients, model.device());
    params_ = PaddedBufferOf<T>(layout_.padded_total, padding, MemTag::parameters, model.device());
    binding_ = std::make_unique<ParameterBinding<T>>(model, params_.span(), layout_.param_offset);
    for (size_t i = 0; full_gradients && i < layout_.param_offset.size(); ++i)
      binding_->bind_grad(i, grads_.span(), layout_.param_offset[i]);  // at its padded place
    // launch is virtual: a subclass's runs (during backward, long after construction).
    readiness_.emplace(model, buckets_, options.find_unused_parameters, "reduce-scattered",
                       [this](int b) { launch(b); }, [this] { comm_queue_.wait_all(); });
  }

  virtual ~Zero1() = default;
  Zero1(const Zero1&) = delete;
  Zero1& operator=(const Zero1&) = delete;

  Communicator& comm() const { return comm_; }
  const std::vector<Bucket>& buckets() const { return buckets_; }
  const ShardLayout& layout() const { return layout_; }
  /// What this engine is, as data (common/driver/engine_description.hpp): stage 1, buckets, shards.
  EngineDescription describe() const {
    return {.zero_stage = 1,
            .unit = "buckets",
            .unit_sizes = bucket_sizes(buckets_),  // real elements, in launch order
            .collectives = options_.collectives,
            .world_size = comm_.world_size(),
            .units = shard_units(layout_),
            .padding = layout_.padding_total};
  }

  /// Model-state bytes each rank should hold, one entry per rank: p + g per element of the
  /// padded parameters and gradients (Ψ + padding each), K per real element of its shard. fp32
  /// 4 + 4 + K of --optimizer (AdamW 8); 16 bits 2 + 2 + 12 (fp32 master, exp_avg, exp_avg_sq).
  /// The ledger's formula line is derived from them (common/precision/shard_precision.hpp).
  std::vector<int64_t> model_states_bytes() const {
    const StateBytes b = optimizer_.state_bytes();
    std::vector<int64_t> bytes;
    for (int r = 0; r < comm_.world_size(); ++r)
      bytes.push_back(static_cast<int64_t>(b.param + b.grad) * layout_.padded_total +
                      static_cast<int64_t>(b.optimizer) * shard_real_of(layout_, r));
    return bytes;
  }

  /// What every rank should send and receive per optimizer step (shard.hpp; the text line is
  /// derived from describe(): common/driver/engine_lesson.hpp).
  TrafficTheory traffic_theory() const {
    return zero_traffic_theory(layout_, comm_.world_size(), options_.collectives,
                               element_bytes<R>(), element_bytes<T>());
  }

  /// The padded parameters and gradients, every bucket (common/zero/shard_state.hpp).
  std::span<T> parameter_storage() { return params_.span(); }
  std::span<T> gradient_storage() { return grads_.span(); }
  /// This rank's optimizer: its shard's state, the loss scale, the backward seed.
  ShardOptimizer& optimizer() { return optimizer_; }
  const ShardOptimizer& optimizer() const { return optimizer_; }

  /// false: the next backwards accumulate locally and send nothing (PyTorch's no_sync());
  /// true: the next backward reduce-scatters (chapter 05's readiness.hpp).
  void set_require_sync(bool sync) { readiness_->set_require_sync(sync); }

  /// After finalize_backward(): this rank's reduced gradient of bucket b, the mean over ranks of
  /// the real elements of its shard (layout().buckets[b].real of them), what step() updates
  /// from: in place in grads_, or the reduce's (R wider than T); ZeRO-2's own shard.
  virtual std::span<R> shard_grads(size_t b) {
    return reduce_.shard(shard_of(grads_.span(), b), layout_.buckets[b].shard_offset);
  }

  /// Sets every gradient (and the partial sums a reduce-scatter left outside the shard) to zero.
  virtual void zero_grad() { zero_elements(grads_.span()); }

  /// After backward, before the optimizer step: chapter 05's finalize (unused parameters,
  /// errors); on return every bucket is reduce-scattered and this rank's shard holds the mean.
  /// Does nothing when require_sync is false.
  virtual void finalize_backward() { readiness_->finalize_backward(); }

  /// Collective, after finalize_backward(): this rank's optimizer updates the real elements of
  /// its shard of every bucket (--clip-grad-norm over all shards first: zero/sharded_clip.hpp),
  /// then each bucket's parameters are all-gathered on the comm thread (bucket b's while the
  /// optimizer works on b + 1). Returns when every rank holds every parameter; false, on every
  /// rank, when fp16's loss scaler found an overflow on some rank (nothing updated or gathered).
  bool step() {
    std::vector<std::span<R>> grads;  // (buckets) this rank's reduced gradient shard
    for (size_t b = 0; b < layout_.buckets.size(); ++b) grads.push_back(shard_grads(b));
    if (!optimizer_.prepare(comm_, grads)) return false;  // fp16: an overflow on some rank
    // BEGIN EXERCISE 06.1 (ZeRO-1: shard step and parameter all-gather)
    for (size_t b = 0; b < layout_.buckets.size(); ++b) {
      optimizer_.step(b, shard_params(b), shard_grads(b));
      const BucketShard& s = layout_.buckets[b];
      std::span<T> bucket = params_.span().subspan(s.padded_offset, s.padded_size());
      comm_queue_.submit({.kind = CollectiveSequence::kAllGather,
                          .unit = static_cast<int>(b),
                          .bytes = element_bytes<T>() * s.padded_size(),
                          .checked = false},
                         [this, bucket] {
                           all_gather_bucket(comm_, bucket, reduce_.gather_scratch(),
                                             options_.collectives);  // shard.hpp
                         });
    }
    comm_queue_.wait_all();
    // END EXERCISE 06.1
    return true;
  }

  /// Collective: one bucket's padded fp32 buffer all-gathered with the ring (rank r's shard at
  /// r·s; any --collectives), for the states common/zero/shard_state.hpp gathers whole.
  void gather_state(size_t, std::span<float> bucket) { ring_all_gather(comm_, bucket); }

 protected:
  // This rank's shard of bucket b in a padded buffer, and its real elements in ours.
  template <class E>
  std::span<E> shard_of(std::span<E> padded, size_t b) const {
    const BucketShard& s = layout_.buckets[b];
    return padded.subspan(s.padded_offset + comm_.rank() * s.shard_size, s.real);
  }
  std::span<T> shard_params(size_t b) { return shard_of(params_.span(), b); }

  // Queues bucket b's reduce-scatter on the comm thread, returns at once (comm_queue.hpp).
  virtual void launch(int b) {
    const BucketShard& s = layout_.buckets[b];
    comm_queue_.submit(
        {.kind = CollectiveSequence::kReduceScatter, .unit = b, .elements = s.padded_size(),
         .bytes = element_bytes<R>() * s.padded_size(), .params = std::ssize(buckets_[b].params)},
        [this, &s] {
          std::span<T> bucket = grads_.span().subspan(s.padded_offset, s.padded_size());
          reduce_.reduce(bucket, s.shard_offset, [&](auto grads, auto scratch) {  // in R: the mean
            return reduce_scatter_bucket(comm_, grads, s.shard_size, scratch,
                                         options_.collectives);  // shard.hpp
          });
        });
  }

  Communicator& comm_;
  Model& model_;
  Options options_;
  std::vector<Bucket> buckets_;
  ShardLayout layout_;
  ShardOptimizer optimizer_;  // this rank's shard: --optimizer, or fp32 masters (16 bits)
  ShardReduce<T, R> reduce_;  // --reduce-dtype: the collective's scratch (and widening)
  PaddedBufferOf<T> params_;  // (Ψ + padding) every parameter, padded per bucket
  PaddedBufferOf<T> grads_;   // (Ψ + padding) every gradient, same layout (ZeRO-2: none)
  std::unique_ptr<ParameterBinding<T>> binding_;  // forward/backward's view of our buffers
  std::optional<BucketReadiness> readiness_;      // chapter 05's: when a bucket is launched
  friend struct BucketOrderFault;                 // tests/tools/rank_fault.cpp: a rank out of order
  // Last: drained first, while everything above lives (a subclass drains it in its destructor).
  CommQueue comm_queue_{comm_, options_.tracer, bucket_naming("zero")};
};

}  // namespace ringzero
