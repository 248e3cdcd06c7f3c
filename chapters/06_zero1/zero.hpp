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
// rules (ddp.hpp: "Rules that keep every rank in step", "Unused parameters"), reduce-scatter
// in place of all-reduce; with --check-collectives each reduce-scatter is first checked across
// ranks (common/collective_check.hpp; the all-gathers of step() run in a fixed loop). Leaves out:
// bucket rebuilding, comm hooks, static graphs, broadcast buffers, overlapping the all-gather with
// the next forward (DeepSpeed's prefetch).
//
// In 16 bits (--precision bf16|fp16; sharded_mixed.hpp): the padded parameters and gradients
// are 16-bit (2 bytes per element), read and written by forward and backward through
// HalfStorage's one-layer fp32 working copy; backward is seeded with loss_scale/(N·K), so the
// 16-bit reduce-scatter's sum is already the mean; each rank keeps the fp32 master weights and
// AdamW moments of its shard (12 bytes per element); the all-gather moves the rounded 16-bit
// parameters. Model states 2Ψ + 2Ψ + 12Ψ/N; 2(N−1)/N·2(Ψ + padding) bytes per step.
#pragma once

#include <map>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "chapters/05_ddp_buckets/buckets.hpp"
#include "chapters/06_zero1/bucket_collectives.hpp"
#include "chapters/06_zero1/shard.hpp"
#include "chapters/06_zero1/sharded_clip.hpp"
#include "chapters/06_zero1/sharded_mixed.hpp"
#include "common/checkpoint.hpp"
#include "common/collective_check.hpp"
#include "common/collectives.hpp"
#include "common/comm_thread.hpp"
#include "common/dist.hpp"
#include "common/mixed.hpp"
#include "common/optim.hpp"
#include "common/padded_buffer.hpp"
#include "common/safetensors.hpp"
#include "common/trace.hpp"
#include "common/train.hpp"
#include "common/zero_memory.hpp"

namespace ringzero {

/// ZeRO stage 1 (the ZeRO paper's P_os) on chapter 05's buckets: every rank holds every
/// parameter and gradient (padded per bucket) and the optimizer state of its shard only.
/// Collective: every rank constructs one and calls its methods in the same order.
class Zero1 {
 public:
  struct Options {
    double bucket_cap_mb = 25.0;       ///< PyTorch's default
    double first_bucket_cap_mb = 1.0;  ///< PyTorch's dist._DEFAULT_FIRST_BUCKET_BYTES
    bool find_unused_parameters = false;
    Collectives collectives =
        Collectives::ring;  ///< ring (chapter 04's) | mpi (MPI_Reduce_scatter_block, MPI_Allgather)
    Tracer* tracer = nullptr;  ///< optional: launch, reduce-scatter and all-gather events
  };

  /// Plans the buckets and their shards, checks the plan is the same on every rank
  /// (collective), moves the parameters and gradients of `model` into padded flat buffers
  /// (freeing the model's own; Model::num_parameters() still reads Ψ, fixed at construction),
  /// builds this rank's optimizer for its shard (--optimizer of `config`) and hooks every
  /// parameter. comm and model must outlive the Zero1. --precision bf16|fp16: the buffers are
  /// 16-bit and the optimizer is this rank's shard of fp32 master weights (move_to_16_bits).
  Zero1(Communicator& comm, Model& model, const TrainConfig& config, Options options)
      : comm_(comm),
        model_(model),
        options_(options),
        buckets_(plan_buckets(parameter_sizes(model), mib_to_bytes(options.bucket_cap_mb),
                              mib_to_bytes(options.first_bucket_cap_mb))),
        layout_(plan_shards(model, buckets_, comm.rank(), comm.world_size())),
        psi_(model.num_parameters()) {
    states_ = fp32_state_bytes(config.optimizer, config.momentum);  // K of --optimizer
    check_bucket_plans_match(comm, buckets_);
    const auto& params = model.parameters();
    bucket_of_.resize(params.size());
    int64_t largest_chunk = 0;
    for (size_t b = 0; b < buckets_.size(); ++b) {
      for (int p : buckets_[b].params) bucket_of_[p] = static_cast<int>(b);
      largest_chunk = std::max(largest_chunk, layout_.buckets[b].shard_size);
    }
    if (config.precision != "fp32") {
      move_to_16_bits(config, largest_chunk);  // before the gradient-ready hooks below
    } else {
      scratch_ = Buffer(largest_chunk, MemTag::comm_buffers);  // (s) the ring's incoming chunk
      // Every parameter moves to its padded place. The gradients are zero: free them first.
      model.grads_memory.release();
      grads_ = PaddedBuffer(layout_.padded_total, layout_.padded_total - psi_, MemTag::gradients);
      params_ = PaddedBuffer(layout_.padded_total, layout_.padded_total - psi_, MemTag::parameters);
      for (size_t i = 0; i < params.size(); ++i) {
        Parameter& p = *params[i];
        float* data = params_.data() + layout_.param_offset[i];
        std::copy_n(p.data.data(), p.numel(), data);
        p.data = Tensor(data, p.shape());
        p.grad = Tensor(grads_.data() + layout_.param_offset[i], p.shape());
      }
      model.params_memory.release();
    }
    if (!mixed_) {
      optimizers_.reserve(layout_.buckets.size());
      for (const BucketShard& s : layout_.buckets)
        optimizers_.emplace_back(config, s.segments);  // (real) each
    }
    reset();
    for (size_t i = 0; i < params.size(); ++i)
      params[i]->add_grad_ready_hook([this, i](Parameter&) { mark_ready(static_cast<int>(i)); });
  }

  /// Waits for the communication thread and removes the hooks.
  ~Zero1() {
    for (Parameter* p : model_.parameters()) p->clear_grad_ready_hooks();
  }
  Zero1(const Zero1&) = delete;
  Zero1& operator=(const Zero1&) = delete;

  const std::vector<Bucket>& buckets() const { return buckets_; }
  const ShardLayout& layout() const { return layout_; }

  /// Model-state bytes each rank should hold (zero_io.cpp).
  std::vector<int64_t> model_states_bytes() const;
  /// The ledger's formula line: ZeRO-1's formula, and the exact bytes of every rank (zero_io.cpp).
  std::string ledger_formula() const;

  /// What every rank should send and receive per optimizer step (bucket_collectives.hpp): in
  /// 16 bits 2 bytes per element (4 on the reduce-scatter with --reduce-dtype fp32).
  TrafficTheory traffic_theory() const {
    if (mixed_)
      return zero_traffic_theory(layout_, comm_.world_size(), psi_, options_.collectives,
                                 mixed_->reduce_dtype() == Dtype::fp32 ? 4 : 2, 2);
    return zero_traffic_theory(layout_, comm_.world_size(), psi_, options_.collectives);
  }

  /// In 16 bits: the padded 16-bit parameters, every bucket (tests); empty in fp32.
  std::span<const uint16_t> parameters16() const { return params16_.span(); }
  /// In 16 bits: the masters, moments, loss scale and dtypes (sharded_mixed.hpp); null in fp32.
  ShardedMixedPrecision* mixed() { return mixed_ ? &*mixed_ : nullptr; }
  const ShardedMixedPrecision* mixed() const { return mixed_ ? &*mixed_ : nullptr; }

  /// While a NoSync lives, backward accumulates gradients locally and communicates nothing
  /// (PyTorch's `with ddp.no_sync():`).
  class NoSync {
   public:
    explicit NoSync(Zero1& zero)
        : zero_(zero), previous_(std::exchange(zero.require_sync_, false)) {}
    ~NoSync() { zero_.require_sync_ = previous_; }
    NoSync(const NoSync&) = delete;
    NoSync& operator=(const NoSync&) = delete;

   private:
    Zero1& zero_;
    bool previous_;
  };
  [[nodiscard]] NoSync no_sync() { return NoSync(*this); }

  /// Sets every gradient (and the partial sums a reduce-scatter left outside the shard) to zero.
  void zero_grad() {
    std::fill(grads_.data(), grads_.data() + grads_.size(), 0.0f);
    std::fill(grads16_.data(), grads16_.data() + grads16_.size(), uint16_t{0});  // 16 bits
  }

  /// After backward, before the optimizer step (PyTorch runs this as backward's final
  /// callback): handles unused parameters, waits until every bucket is reduce-scattered and
  /// this rank's shard divided by world_size. Does nothing inside no_sync(). Errors: unused
  /// parameters without find_unused_parameters (names them), a failed reduce-scatter.
  void finalize_backward() {
    // BEGIN EXERCISE 05.3 (no_sync: finalize; chapter 05's, copied forward)
    if (!require_sync_) return;
    // END EXERCISE 05.3
    std::string unused;
    for (size_t i = 0; i < ready_.size(); ++i)
      if (!ready_[i]) unused += (unused.empty() ? "" : ", ") + model_.parameters()[i]->name();
    if (!unused.empty() && options_.find_unused_parameters) {
      for (int i = static_cast<int>(ready_.size()) - 1; i >= 0; --i)
        if (!ready_[i]) mark_ready(i);  // their gradient for this backward: zero
    } else if (!unused.empty()) {
      comm_thread_.wait_all();  // the buckets launched so far: every rank launched them too
      reset();
      RZ_CHECK(
          false,
          "parameters that received no gradient in this backward: "
              << unused
              << ". Their buckets can never be reduce-scattered, and every rank would wait for "
              << "them forever. Make every parameter take part in the loss, or pass "
                 "--find-unused-parameters "
              << "(PyTorch: find_unused_parameters=True) to count a missing gradient as zero");
    }
    comm_thread_.wait_all();
    reset();
  }

  /// Collective, after finalize_backward(): scales this rank's gradient shard so that the
  /// global L2 norm of the gradient is at most max_norm (torch.nn.utils.clip_grad_norm_);
  /// returns the norm before clipping. Every rank adds every rank's Σ g² over its shard, in
  /// rank order (sharded_clip.hpp's clip_sharded_grad_norm).
  double clip_grad_norm(float max_norm) {
    std::vector<std::span<float>> shards;  // (buckets) this rank's real gradient elements
    for (size_t b = 0; b < layout_.buckets.size(); ++b) shards.push_back(shard_grads(b));
    return clip_sharded_grad_norm(comm_, shards, max_norm);
  }

  /// Collective: every rank's optimizer updates the real elements of its shard of every
  /// bucket, then each bucket's parameters are all-gathered on the comm thread (bucket b's
  /// while the optimizer works on b + 1). Returns when every rank holds every parameter.
  void step() {
    // BEGIN EXERCISE 06.1 (ZeRO-1: shard step and parameter all-gather)
    for (size_t b = 0; b < layout_.buckets.size(); ++b) {
      optimizers_[b].step(shard_params(b), shard_grads(b));
      Tracer* tracer = options_.tracer;
      comm_thread_.submit([this, b, tracer] {
        const double start = tracer ? tracer->now_us() : 0;
        const BucketShard& s = layout_.buckets[b];
        std::span<float> bucket = params_.span().subspan(s.padded_offset, s.padded_size());
        all_gather_bucket(comm_, bucket, s.shard_size, scratch_.span(),
                          options_.collectives);  // bucket_collectives.hpp
        if (tracer)
          tracer->complete("all_gather bucket " + std::to_string(b), "comm", Tracer::kCommTrack,
                           start, tracer->now_us() - start, {{"bytes", 4 * s.padded_size()}});
      });
    }
    comm_thread_.wait_all();
    // END EXERCISE 06.1
  }

  /// Collective, in 16 bits, in place of clip_grad_norm() and step(): the overflow decision
  /// (fp16) and the clip coefficient over every rank's shard (sharded_mixed.hpp), then per
  /// bucket this rank's masters update its shard and write it rounded into the 16-bit
  /// parameters, which are all-gathered in 16 bits on the comm thread (as step()). Returns
  /// false, on every rank, when an fp16 overflow skipped the step (nothing updated, nothing
  /// gathered). clip_grad_norm 0: off.
  bool step_16_bits(float clip_grad_norm) {
    std::vector<std::span<const uint16_t>> shards;  // (buckets) this rank's real gradients
    for (size_t b = 0; b < layout_.buckets.size(); ++b) shards.push_back(shard_grads16(b));
    float factor = 1.0f;  // 1/scale times the clip coefficient
    if (!mixed_->decide(comm_, shards, clip_grad_norm, factor)) return false;
    for (size_t b = 0; b < layout_.buckets.size(); ++b) {
      mixed_->bucket(b).step(shard_params16(b), shard_grads16(b), factor);
      Tracer* tracer = options_.tracer;
      comm_thread_.submit([this, b, tracer] {
        const double start = tracer ? tracer->now_us() : 0;
        const BucketShard& s = layout_.buckets[b];
        all_gather_bucket16(comm_, params16_.span().subspan(s.padded_offset, s.padded_size()));
        if (tracer)
          tracer->complete("all_gather bucket " + std::to_string(b), "comm", Tracer::kCommTrack,
                           start, tracer->now_us() - start, {{"bytes", 2 * s.padded_size()}});
      });
    }
    comm_thread_.wait_all();
    return true;
  }

  /// Collective, for the equivalence tests: AdamW's state gathered from every rank's shards
  /// (zero_io.cpp).
  std::map<std::string, NamedTensor> optimizer_state_dict();
  /// Collective, in 16 bits (--save-final): the fp32 master weights gathered from every rank's
  /// shards under the model's state_dict() names. Errors: fp32 (the parameters are the state).
  std::map<std::string, NamedTensor> master_state_dict() {
    RZ_CHECK(mixed_, "master_state_dict: an fp32 run has no master weights");
    return mixed_->master_state_dict(comm_, model_, layout_);
  }
  /// The training state as common/checkpoint.hpp saves and loads it: one piece per bucket
  /// (this rank's real shard elements and their optimizer) at its global offset (zero_io.cpp).
  TrainingState training_state();
  /// Elements of the padding that are not zero: must be 0 (zero_io.cpp).
  int64_t nonzero_padding() const;

 private:
  // This rank's shard of bucket b in a padded buffer, and its real elements in ours.
  std::span<float> shard_of(std::span<float> padded, size_t b) const {
    const BucketShard& s = layout_.buckets[b];
    return padded.subspan(s.padded_offset + comm_.rank() * s.shard_size, s.real);
  }
  std::span<float> shard_params(size_t b) { return shard_of(params_.span(), b); }
  std::span<float> shard_grads(size_t b) { return shard_of(grads_.span(), b); }
  // The same in 16 bits.
  std::span<uint16_t> shard_of16(std::span<uint16_t> padded, size_t b) const {
    const BucketShard& s = layout_.buckets[b];
    return padded.subspan(s.padded_offset + comm_.rank() * s.shard_size, s.real);
  }
  std::span<uint16_t> shard_params16(size_t b) { return shard_of16(params16_.span(), b); }
  std::span<uint16_t> shard_grads16(size_t b) { return shard_of16(grads16_.span(), b); }

  // --precision bf16|fp16 (sharded_mixed.hpp): this rank's fp32 master weights and moments
  // are read from the model's fp32 parameters first; then the parameters move, rounded, to
  // their padded places in params16_ and the model's fp32 buffers are freed (HalfStorage,
  // whose gradient-ready hooks add each 16-bit gradient into grads16_, registered before
  // ours); the ring's 16-bit scratch chunk, and for --reduce-dtype fp32 an fp32 bucket.
  void move_to_16_bits(const TrainConfig& config, int64_t largest_chunk) {
    RZ_CHECK(options_.collectives == Collectives::ring,
             "--collectives mpi with --precision "
                 << config.precision
                 << ": MPI has no bf16/fp16 sum, so 16-bit gradients are reduced by chapter 04's "
                    "ring only; drop --collectives mpi (ring is the default) or use --precision "
                    "fp32");
    mixed_.emplace(model_, layout_, comm_.rank(), config);
    const int64_t padding = layout_.padded_total - psi_;
    params16_ = PaddedBuffer16(layout_.padded_total, padding, MemTag::parameters);
    grads16_ = PaddedBuffer16(layout_.padded_total, padding, MemTag::gradients);
    half_.emplace(model_, mixed_->dtype(), params16_.span(), layout_.param_offset);
    const auto& params = model_.parameters();
    for (size_t i = 0; i < params.size(); ++i)
      half_->set_grad16(i, grads16_.span().subspan(static_cast<size_t>(layout_.param_offset[i]),
                                                   static_cast<size_t>(params[i]->numel())));
    scratch16_ = Buffer16(largest_chunk, MemTag::comm_buffers);  // (s) the ring's incoming chunk
    int64_t largest_bucket = 0;
    for (const BucketShard& s : layout_.buckets)
      largest_bucket = std::max(largest_bucket, s.padded_size());
    if (mixed_->reduce_dtype() == Dtype::fp32)  // (n + padding + s) widened bucket + scratch
      wide_ = Buffer(largest_bucket + largest_chunk, MemTag::comm_buffers);
  }

  // Bucket b's 16-bit reduce-scatter (comm thread): the sum of the pre-divided gradients, the
  // mean, lands in this rank's shard of grads16_ (bucket_collectives.hpp).
  void reduce_scatter16(size_t b) {
    const BucketShard& s = layout_.buckets[b];
    reduce_scatter_bucket16(comm_, grads16_.span().subspan(s.padded_offset, s.padded_size()),
                            s.shard_size, mixed_->dtype(), mixed_->reduce_dtype(),
                            scratch16_.span(), wide_.span());
  }

  void reset() {
    ready_.assign(model_.parameters().size(), 0);
    pending_.clear();
    for (const Bucket& b : buckets_) pending_.push_back(static_cast<int>(b.params.size()));
    next_bucket_ = 0;
  }

  // The gradient-ready hook of parameter i (main thread, during backward).
  void mark_ready(int i) {
    // BEGIN EXERCISE 05.3 (no_sync: the hook; chapter 05's, copied forward)
    if (!require_sync_) return;
    // END EXERCISE 05.3
    RZ_CHECK(!ready_[i],
             "parameter "
                 << model_.parameters()[i]->name() << " became ready twice in one backward; "
                 << "call finalize_backward() after every backward that is not inside no_sync()");
    // BEGIN EXERCISE 05.2 (the gradient-ready hook; chapter 05's, copied forward)
    ready_[i] = 1;
    --pending_[bucket_of_[i]];
    while (next_bucket_ < static_cast<int>(buckets_.size()) && pending_[next_bucket_] == 0)
      launch(next_bucket_++);
    // END EXERCISE 05.2
  }

  // Queues bucket b's reduce-scatter on the communication thread; returns at once.
  void launch(int b) {
    Tracer* tracer = options_.tracer;
    const double launched = tracer ? tracer->now_us() : 0;
    if (tracer) tracer->instant("launch bucket " + std::to_string(b), "zero", Tracer::kMainTrack);
    const CollectiveHeader header =
        sequence_.next(CollectiveSequence::kReduceScatter, b, layout_.buckets[b].padded_size());
    comm_thread_.submit([this, b, tracer, launched, header] {
      sequence_.check(comm_, header);  // --check-collectives: every rank, this reduce-scatter
      const double start = tracer ? tracer->now_us() : 0;
      const BucketShard& s = layout_.buckets[b];
      if (half_) {
        reduce_scatter16(b);  // 16 bits: the gradients were pre-divided by N, the sum is the mean
      } else {
        std::span<float> bucket = grads_.span().subspan(s.padded_offset, s.padded_size());
        std::span<float> shard = reduce_scatter_bucket(
            comm_, bucket, s.shard_size, scratch_.span(),
            options_.collectives);  // bucket_collectives.hpp: ours holds the sum
        for (float& g : shard)
          g /= static_cast<float>(comm_.world_size());  // as chapter 05: the mean
      }
      if (tracer)
        tracer->complete("reduce_scatter bucket " + std::to_string(b), "comm", Tracer::kCommTrack,
                         start, tracer->now_us() - start,
                         {{"bytes", (half_ ? 2 : 4) * s.padded_size()},
                          {"params", buckets_[b].params.size()},
                          {"queued_us", start - launched}});
    });
  }

  Communicator& comm_;
  Model& model_;
  Options options_;
  std::vector<Bucket> buckets_;
  ShardLayout layout_;
  int64_t psi_;                    // Ψ
  StateBytes states_ = kFp32Adam;  // bytes per parameter: p, g, K (--optimizer)
  PaddedBuffer params_;            // (Ψ + padding) every parameter, padded per bucket
  PaddedBuffer grads_;             // (Ψ + padding) every gradient, same layout
  // 16 bits (--precision bf16|fp16), in place of params_, grads_, optimizers_ and scratch_:
  std::optional<ShardedMixedPrecision> mixed_;  // this rank's fp32 masters + moments, scaler
  PaddedBuffer16 params16_;                     // (Ψ + padding) 16-bit parameters
  PaddedBuffer16 grads16_;                      // (Ψ + padding) 16-bit gradients
  std::optional<HalfStorage> half_;    // forward/backward read params16_ via one fp32 layer
  Buffer16 scratch16_;                 // (s) the 16-bit ring's incoming chunk
  Buffer wide_;                        // --reduce-dtype fp32: (n + padding + s) widened bucket
  std::vector<Optimizer> optimizers_;  // (buckets) each over this rank's real shard elements
  std::vector<int> bucket_of_;         // (P) bucket of each parameter
  std::vector<int> pending_;           // (buckets) parameters not ready yet in this backward
  std::vector<char> ready_;            // (P) 1 once the parameter's gradient is final
  int next_bucket_ = 0;                // the next bucket to launch: launches happen in plan order
  bool require_sync_ = true;
  Buffer scratch_;
  CollectiveSequence sequence_;    // numbers the collectives for --check-collectives
  friend struct BucketOrderFault;  // tests/tools/rank_fault.cpp: a rank out of order
  CommThread comm_thread_;         // last: destroyed (drained) first, while everything above lives
};

}  // namespace ringzero
