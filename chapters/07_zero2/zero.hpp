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
// no_sync() and accumulate as in DDP (the full 4Ψ lives again: one reduce per step); DeepSpeed
// reduce-scatters every micro-step instead (4Ψ/N, K times the traffic, not bitwise).
// Every rank stays in step by chapter 05's rules (ddp.hpp: "Rules that keep every rank in
// step", "Unused parameters"), reduce-scatter in place of all-reduce; --check-collectives checks
// each reduce-scatter across ranks first (common/collective_check.hpp). Leaves out: what chapter
// 06's zero.hpp leaves out.
//
// In 16 bits (--precision bf16|fp16; chapter 06's sharded_mixed.hpp): chapter 06's 16-bit
// path, keeping only the shard: the padded parameters are 16-bit, each bucket in flight is a
// 16-bit buffer into which HalfStorage adds its parameters' 16-bit gradients, its 16-bit
// reduce-scatter (the sum of gradients pre-divided by N: the mean) is copied into this rank's
// 16-bit gradient shard, and the fp32 master weights and AdamW moments of the shard update it.
// Model states 2Ψ + (2 + 12)Ψ/N plus two 16-bit buckets; the same 2(N−1)/N·2(Ψ + padding)
// bytes per step and the same sums as chapter 06 in 16 bits.
#pragma once

#include <map>
#include <memory>
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

/// ZeRO stage 2 (P_os+g) on chapter 05's buckets: every rank holds every parameter (padded per
/// bucket), the gradient and optimizer state of its shard, and at most two full buckets of
/// gradient while backward runs. Collective: every rank calls its methods in the same order.
class Zero2 {
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
  /// (collective), moves the parameters of `model` into a padded flat buffer and frees its
  /// gradients (Model::num_parameters() still reads Ψ, fixed at construction), keeps a gradient
  /// shard, builds this rank's optimizer for its shard (--optimizer of `config`), hooks every
  /// parameter and every Linear layer (pre-backward: allocate its buckets). comm and model must
  /// outlive the Zero2; the layer hooks stay on the model but do nothing once it is gone.
  /// --precision bf16|fp16: the buffers are 16-bit and the optimizer is this rank's shard of
  /// fp32 master weights (move_to_16_bits).
  Zero2(Communicator& comm, Model& model, const TrainConfig& config, Options options)
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
      // Every parameter moves to its padded place. The gradients are zero: free them first; a
      // parameter has gradient storage only while its bucket is in flight.
      model.grads_memory.release();
      grad_shard_ = PaddedBuffer(layout_.shard_total, layout_.shard_total - layout_.shard_real,
                                 MemTag::gradients);
      params_ = PaddedBuffer(layout_.padded_total, layout_.padded_total - psi_, MemTag::parameters);
      for (size_t i = 0; i < params.size(); ++i) {
        Parameter& p = *params[i];
        float* data = params_.data() + layout_.param_offset[i];
        std::copy_n(p.data.data(), p.numel(), data);
        p.data = Tensor(data, p.shape());
        p.grad = Tensor();
      }
      model.params_memory.release();
    }
    bucket_grads_.resize(buckets_.size());
    bucket_grads16_.resize(buckets_.size());
    tickets_.assign(buckets_.size(), 0);
    for (Linear* layer : model.linear_layers()) {  // a layer's backward needs its buckets' memory
      std::vector<int> mine;
      for (Parameter* p : layer->parameters())
        mine.push_back(
            static_cast<int>(std::find(params.begin(), params.end(), p) - params.begin()));
      layer->add_pre_backward_hook([alive = alive_, mine](Module&) {
        if (*alive)
          for (int i : mine) (*alive)->allocate_bucket((*alive)->bucket_of_[i]);
      });
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

  /// Waits for the communication thread and removes the hooks (the layer hooks go quiet).
  ~Zero2() {
    *alive_ = nullptr;
    for (Parameter* p : model_.parameters()) p->clear_grad_ready_hooks();
  }
  Zero2(const Zero2&) = delete;
  Zero2& operator=(const Zero2&) = delete;

  const std::vector<Bucket>& buckets() const { return buckets_; }
  const ShardLayout& layout() const { return layout_; }

  /// Model-state bytes each rank should hold between steps (zero_io.cpp).
  std::vector<int64_t> model_states_bytes() const;
  /// The most bytes of full bucket gradients alive at once, K = 1 (zero_io.cpp).
  int64_t in_flight_peak_bytes() const;
  /// The ledger's formula line: ZeRO-2's formula, and the exact bytes of every rank (zero_io.cpp).
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
    explicit NoSync(Zero2& zero)
        : zero_(zero), previous_(std::exchange(zero.require_sync_, false)) {}
    ~NoSync() { zero_.require_sync_ = previous_; }
    NoSync(const NoSync&) = delete;
    NoSync& operator=(const NoSync&) = delete;

   private:
    Zero2& zero_;
    bool previous_;
  };
  [[nodiscard]] NoSync no_sync() { return NoSync(*this); }

  /// Drops every gradient: frees the buckets (they come back as zeros) and zeroes the shard.
  void zero_grad() {
    comm_thread_.wait_all();
    for (size_t b = 0; b < bucket_grads_.size(); ++b) free_bucket(b);
    std::fill(grad_shard_.data(), grad_shard_.data() + grad_shard_.size(), 0.0f);
    std::fill(grad_shard16_.data(), grad_shard16_.data() + grad_shard16_.size(),
              uint16_t{0});  // 16 bits
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
    for (size_t b = 0; b < bucket_grads_.size(); ++b)
      free_bucket(b);  // reduced: only the shard stays
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
    // BEGIN EXERCISE 06.1 (ZeRO-1's step, copied forward)
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
  std::span<float> shard_grads(size_t b) {
    return grad_shard_.span().subspan(layout_.buckets[b].shard_offset, layout_.buckets[b].real);
  }
  // The same in 16 bits.
  std::span<uint16_t> shard_of16(std::span<uint16_t> padded, size_t b) const {
    const BucketShard& s = layout_.buckets[b];
    return padded.subspan(s.padded_offset + comm_.rank() * s.shard_size, s.real);
  }
  std::span<uint16_t> shard_params16(size_t b) { return shard_of16(params16_.span(), b); }
  std::span<uint16_t> shard_grads16(size_t b) {
    return grad_shard16_.span().subspan(layout_.buckets[b].shard_offset, layout_.buckets[b].real);
  }

  // --precision bf16|fp16 (sharded_mixed.hpp): this rank's fp32 master weights and moments
  // are read from the model's fp32 parameters first; then the parameters move, rounded, to
  // their padded places in params16_ and the model's fp32 buffers are freed (HalfStorage,
  // whose gradient-ready hooks add each 16-bit gradient into its bucket in flight, registered
  // before ours); the 16-bit gradient shard; the ring's 16-bit scratch chunk, and for
  // --reduce-dtype fp32 an fp32 bucket.
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
    grad_shard16_ = PaddedBuffer16(layout_.shard_total, layout_.shard_total - layout_.shard_real,
                                   MemTag::gradients);
    half_.emplace(model_, mixed_->dtype(), params16_.span(), layout_.param_offset);
    // A parameter's 16-bit gradient storage exists only while its bucket is in flight
    // (allocate_bucket's set_grad16).
    scratch16_ = Buffer16(largest_chunk, MemTag::comm_buffers);  // (s) the ring's incoming chunk
    int64_t largest_bucket = 0;
    for (const BucketShard& s : layout_.buckets)
      largest_bucket = std::max(largest_bucket, s.padded_size());
    if (mixed_->reduce_dtype() == Dtype::fp32)  // (n + padding + s) widened bucket + scratch
      wide_ = Buffer(largest_bucket + largest_chunk, MemTag::comm_buffers);
  }

  // Bucket b's 16-bit reduce-scatter (comm thread): the sum of the pre-divided gradients, the
  // mean, lands in this rank's chunk of the bucket, which is all we keep (bucket_collectives.hpp).
  void reduce_scatter16(size_t b) {
    const BucketShard& s = layout_.buckets[b];
    std::span<uint16_t> shard =
        reduce_scatter_bucket16(comm_, bucket_grads16_[b].span(), s.shard_size, mixed_->dtype(),
                                mixed_->reduce_dtype(), scratch16_.span(), wide_.span());
    std::copy(shard.begin(), shard.end(), grad_shard16_.data() + s.shard_offset);
  }

  // Gives bucket b its full gradient (zeros) and points its parameters' grads into it, first
  // freeing bucket b − 2 and older: at most two buckets exist at a time. Main thread.
  void allocate_bucket(int b) {
    if (bucket_grads_[b].size() > 0 || bucket_grads16_[b].size() > 0)
      return;  // already there (this step, or accumulating)
    for (int old = 0; old + 1 < b; ++old)
      if (tickets_[old] != 0) free_bucket(old);
    const BucketShard& s = layout_.buckets[b];
    if (half_) {  // 16 bits: HalfStorage adds the parameters' 16-bit gradients into the bucket
      bucket_grads16_[b] = PaddedBuffer16(s.padded_size(), s.padding, MemTag::gradients);
      for (int p : buckets_[b].params)
        half_->set_grad16(static_cast<size_t>(p),
                          bucket_grads16_[b].span().subspan(
                              static_cast<size_t>(model_.offsets()[p] - s.offset),
                              static_cast<size_t>(model_.parameters()[p]->numel())));
      return;
    }
    bucket_grads_[b] = PaddedBuffer(s.padded_size(), s.padding, MemTag::gradients);
    for (int p : buckets_[b].params) {
      Parameter& param = *model_.parameters()[p];
      param.grad =
          Tensor(bucket_grads_[b].data() + (model_.offsets()[p] - s.offset), param.shape());
    }
  }

  // Waits until bucket b is reduced (if it was launched), then frees its full gradient.
  void free_bucket(size_t b) {
    if (tickets_[b] != 0) comm_thread_.wait(tickets_[b]);
    tickets_[b] = 0;
    if (half_ && bucket_grads16_[b].size() > 0) {  // 16 bits
      bucket_grads16_[b].release();
      for (int p : buckets_[b].params) half_->set_grad16(static_cast<size_t>(p), {});
    }
    if (bucket_grads_[b].size() == 0) return;
    bucket_grads_[b].release();
    for (int p : buckets_[b].params) model_.parameters()[p]->grad = Tensor();
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
    allocate_bucket(b);  // only for a bucket no backward touched (find_unused_parameters)
    Tracer* tracer = options_.tracer;
    const double launched = tracer ? tracer->now_us() : 0;
    if (tracer) tracer->instant("launch bucket " + std::to_string(b), "zero", Tracer::kMainTrack);
    const CollectiveHeader header =
        sequence_.next(CollectiveSequence::kReduceScatter, b, layout_.buckets[b].padded_size());
    tickets_[b] = comm_thread_.submit([this, b, tracer, launched, header] {
      sequence_.check(comm_, header);  // --check-collectives: every rank, this reduce-scatter
      const double start = tracer ? tracer->now_us() : 0;
      const BucketShard& s = layout_.buckets[b];
      if (half_) {
        reduce_scatter16(b);  // 16 bits: the gradients were pre-divided by N, the sum is the mean
      } else {
        // BEGIN EXERCISE 07.1 (ZeRO-2: reduce-scatter in backward)
        std::span<float> bucket = bucket_grads_[b].span();
        std::span<float> shard = reduce_scatter_bucket(
            comm_, bucket, s.shard_size, scratch_.span(),
            options_.collectives);  // bucket_collectives.hpp: ours holds the sum
        for (float& g : shard)
          g /= static_cast<float>(comm_.world_size());  // as chapter 05: the mean
        std::copy(shard.begin(), shard.end(), grad_shard_.data() + s.shard_offset);  // all we keep
        // END EXERCISE 07.1
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
  int64_t psi_;                             // Ψ
  StateBytes states_ = kFp32Adam;           // bytes per parameter: p, g, K (--optimizer)
  PaddedBuffer params_;                     // (Ψ + padding) every parameter, padded per bucket
  PaddedBuffer grad_shard_;                 // (Σ s) this rank's shard of every bucket's gradient
  std::vector<PaddedBuffer> bucket_grads_;  // (buckets) a bucket's full gradient, while in flight
  std::vector<uint64_t> tickets_;  // (buckets) its reduce-scatter's comm-thread ticket; 0: none
  // 16 bits (--precision bf16|fp16), in place of params_, grad_shard_, bucket_grads_,
  // optimizers_ and scratch_:
  std::optional<ShardedMixedPrecision> mixed_;  // this rank's fp32 masters + moments, scaler
  PaddedBuffer16 params16_;                     // (Ψ + padding) 16-bit parameters
  PaddedBuffer16 grad_shard16_;                 // (Σ s) this rank's 16-bit gradient shard
  std::vector<PaddedBuffer16> bucket_grads16_;  // (buckets) a 16-bit bucket, while in flight
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
  std::shared_ptr<Zero2*> alive_ =
      std::make_shared<Zero2*>(this);  // what the layer hooks reach us by
  CommThread comm_thread_;  // last: destroyed (drained) first, while everything above lives
};

}  // namespace ringzero
