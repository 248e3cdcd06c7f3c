// shard_precision: the run's precision for an engine that shards the optimizer (ZeRO, chapters
// 06-08), written once, so that each engine is written over its element types with no 16-bit
// branch; the sharded counterpart of precision.hpp's ReplicatedPrecision.
//
// An engine is a template over two element types (common/half.hpp), chosen once from the flags
// (llm.c's floatX): T, the parameters' and gradients' (--precision: float, bf16 or fp16), and R,
// the reduced gradient's (--reduce-dtype, default T). Provides:
//  - ShardOptimizer: this rank's optimizer over its shard, one per unit (bucket): fp32:
//    --optimizer over the unit's segments; bf16/fp16: the fp32 master weights and AdamW moments
//    of the shard (MasterWeights, 12 bytes per element: Rajbhandari et al. 2020, §3.1), whose
//    step writes the shard back rounded to T. It also holds what does nothing outside 16 bits:
//    the backward seed (1/K in fp32; loss_scale/(N·K), the mean pre-divided, in 16 bits) and
//    fp16's GradScaler (its overflow verdict taken over every rank).
//  - ShardReduce<T, R>: --reduce-dtype as a communication hook (PyTorch's comm hooks): the
//    engine's reduce-scatter runs on a bucket in R (T widened exactly when they differ), and
//    fp32 training divides the shard's sum by N after it (the bitwise chain to chapter 02).
//  - ParameterBinding<T>: where forward and backward find parameter i and its gradient inside
//    the engine's buffers: fp32, Tensor views; bf16/fp16, HalfStorage's one-layer fp32 copy;
//  - for ZeRO-3, which gathers a layer for its compute: widen_for_compute (a gathered layer of T
//    as fp32), narrow_for_reduce (its fp32 gradient rounded to T, in R), mean_of_sum, narrow_into.
// with_precision (common/with_precision.hpp) picks T and R once, from the flags.
// Leaves out: the layouts, buffers and collectives (the chapters').
#pragma once

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "check.hpp"
#include "comm.hpp"
#include "config.hpp"
#include "half.hpp"
#include "mixed.hpp"
#include "mixed_precision.hpp"
#include "nn.hpp"
#include "optim.hpp"
#include "padded_buffer.hpp"
#include "sharded_clip.hpp"
#include "with_precision.hpp"
#include "zero_memory.hpp"

namespace ringzero {

/// This rank's real elements of one unit's shard (a bucket's, chapters 06-07; a layer's, 08).
struct ShardPiece {
  int64_t model_offset = 0;       ///< its first element in the model's unpadded flat layout
  std::vector<int64_t> segments;  ///< sizes of its parameter pieces, memory order (Σ = real)
};

/// This rank's piece of every unit of a layout (`units`: BucketShards or LayerShards, which
/// give offset, shard_size and segments): rank r's shard starts at offset + r·shard_size (a
/// piece with no segments, padding only, has no elements to read).
template <class Units>
std::vector<ShardPiece> shard_pieces(const Units& units, int rank) {
  std::vector<ShardPiece> pieces;
  for (const auto& s : units) pieces.push_back({s.offset + rank * s.shard_size, s.segments});
  return pieces;
}

/// This rank's optimizer over its shard of every unit, in --precision (see the header).
/// Collective where noted: every rank calls in the same order.
class ShardOptimizer {
 public:
  /// Reads the masters (16 bits) from the model's fp32 parameters: build it before the
  /// parameters move (ParameterBinding frees them). world_size: N. Errors: 16 bits with an
  /// --optimizer other than adamw; the model's fp32 parameters already released (16 bits).
  ShardOptimizer(const Model& model, const TrainConfig& config,
                 const std::vector<ShardPiece>& pieces, int world_size);

  Dtype dtype() const { return dtype_; }
  Dtype reduce_dtype() const { return reduce_dtype_; }
  /// Errors unless T and R are the element types of --precision and --reduce-dtype: an engine
  /// built for other types than the flags' (build lessons through Run::train<Lesson>, which
  /// picks them with with_precision).
  template <Element T, Element R>
  void check_types() const {
    RZ_CHECK(dtype_of<T>() == dtype_ && dtype_of<R>() == reduce_dtype_,
             "this engine is built for parameters in "
                 << dtype_name(dtype_of<T>()) << " and a reduction in " << dtype_name(dtype_of<R>())
                 << ", the flags ask for --precision " << dtype_name(dtype_) << " --reduce-dtype "
                 << dtype_name(reduce_dtype_)
                 << ": build the lesson with Run::train<Lesson> (common/with_precision.hpp)");
  }
  /// Bytes per parameter of p, g and K: fp32_state_bytes(--optimizer), or 2, 2, 12 in 16 bits.
  StateBytes state_bytes() const { return state_bytes_; }
  /// The GradScaler's scale in fp16, else exactly 1.
  float loss_scale() const { return scaler_ ? scaler_->scale() : 1.0f; }
  /// Backward's seed for the mean of K micro-batch means: 1/K in fp32 (the reduce divides the
  /// sum by N); loss_scale/(N·K) in 16 bits (pre-divided, as PyTorch's DDP Reducer divides
  /// every gradient by world_size before its all-reduce: the 16-bit sum is the mean and cannot
  /// overflow by a factor N).
  float seed(int64_t grad_accum_steps) const;
  /// fp16: a non-finite loss at step 1, before any update, is the forward overflowing fp16's
  /// range: stops with a message naming the fix. Does nothing otherwise. Call on every rank.
  void check_first_loss(double loss, int64_t step) const;

  /// Collective, after the reduce: `grads` is this rank's reduced gradient shard (its real
  /// elements), every unit. fp32: clips them in place with --clip-grad-norm over every rank's
  /// shards (clip_sharded_grad_norm). 16 bits: fp16's overflow verdict OR-ed over every rank
  /// (on an overflow every rank returns false, the scale halves, nothing steps), then the
  /// factor step() multiplies the gradients by: 1/scale times the clip coefficient over every
  /// rank's shards, added in rank order. Returns whether to step.
  template <Element R>
  bool prepare(Communicator& comm, const std::vector<std::span<R>>& grads);

  /// Unit u's optimizer step on this rank's shard: params (T) and grads (R), its real elements.
  /// fp32: --optimizer's step. 16 bits: the masters' AdamW step from grads × prepare()'s factor,
  /// then params = the masters rounded to T. Errors: sizes other than the unit's.
  template <Element T, Element R>
  void step(size_t u, std::span<T> params, std::span<R> grads) {
    if constexpr (std::is_same_v<T, float>) {
      optimizers_[u].step(params, grads);
    } else if constexpr (std::is_same_v<R, float>) {
      masters_[u].step(as_bits(params), std::span<const float>(grads), factor_);
    } else {
      masters_[u].step(as_bits(params), as_bits(std::span<const R>(grads)), factor_);
    }
  }

  // ---- the state, for reports, --save-optimizer-state and checkpoints ----
  size_t units() const { return masters_.empty() ? optimizers_.size() : masters_.size(); }
  /// Unit u's fp32 optimizer (fp32 runs; checkpoints). Errors: a 16-bit run.
  Optimizer& optimizer(size_t u);
  /// Unit u's fp32 master weights (16 bits). Errors: an fp32 run (its parameters are the state).
  std::span<const float> master(size_t u) const;
  /// Unit u's AdamW moments and per-segment step counts. Errors: --optimizer sgd.
  std::span<const float> exp_avg(size_t u) const;
  std::span<const float> exp_avg_sq(size_t u) const;
  const std::vector<int64_t>& segment_steps(size_t u) const;
  /// {} in fp32; "precision", "reduce_dtype", and in fp16 "loss_scale", "skipped_steps".
  nlohmann::json summary() const;

 private:
  const AdamW& adamw(size_t u) const;
  Dtype dtype_, reduce_dtype_;
  int world_size_;
  float clip_grad_norm_;
  StateBytes state_bytes_;
  float factor_ = 1.0f;                 // 16 bits: 1/scale × clip coefficient of this step
  std::vector<Optimizer> optimizers_;   // fp32: (units) each over this rank's real elements
  std::vector<MasterWeights> masters_;  // 16 bits: (units) the same, fp32 masters + moments
  std::optional<GradScaler> scaler_;    // fp16 only
};

template <Element R>
bool ShardOptimizer::prepare(Communicator& comm, const std::vector<std::span<R>>& grads) {
  if constexpr (std::is_same_v<R, float>) {
    if (dtype_ == Dtype::fp32) {
      if (clip_grad_norm_ > 0) clip_sharded_grad_norm(comm, grads, clip_grad_norm_);
      return true;
    }
  }
  auto non_finite = [&](std::span<R> g) {
    if constexpr (std::is_same_v<R, float>)
      return has_non_finite(std::span<const float>(g));
    else
      return has_non_finite(dtype_, as_bits(std::span<const R>(g)));
  };
  auto squares = [&](std::span<R> g) {
    if constexpr (std::is_same_v<R, float>)
      return sum_of_squares(std::span<const float>(g), factor_);
    else
      return sum_of_squares_half(dtype_, as_bits(std::span<const R>(g)), factor_);
  };
  factor_ = scaler_ ? scaler_->inv_scale() : 1.0f;
  if (scaler_) {
    bool found_inf = false;
    for (std::span<R> g : grads) found_inf = found_inf || non_finite(g);
    if (!scaler_->update(found_inf_on_any_rank(comm, found_inf))) return false;
  }
  if (clip_grad_norm_ > 0) {
    std::vector<double> sums(static_cast<size_t>(comm.world_size()), 0.0);  // (N) Σ g²
    for (std::span<R> g : grads) sums[comm.rank()] += squares(g);
    factor_ *= clip_coefficient(sum_in_rank_order(comm, sums), clip_grad_norm_);
  }
  return true;
}

/// in[i] as T, into out (the same size): a copy for float; bf16/fp16 rounded to nearest even
/// (convert_to_half). Errors: sizes differ.
template <Element T>
void narrow_into(std::span<const float> in, std::span<T> out) {
  RZ_CHECK(in.size() == out.size(), "narrow_into: " << in.size() << " values into " << out.size());
  if constexpr (std::is_same_v<T, float>)
    std::copy(in.begin(), in.end(), out.begin());
  else
    convert_to_half(T::dtype, in, as_bits(out));
}

/// The fp32 values a gathered layer computes with (ZeRO-3; autocast's fp32 copy): `gathered`
/// itself in fp32 (moved out); in bf16/fp16 a new fp32 buffer (tag comm_buffers) of the values
/// widened (exactly), and `gathered` is freed.
template <Element T>
Buffer widen_for_compute(BufferOf<T>& gathered) {
  if constexpr (std::is_same_v<T, float>) {
    return std::move(gathered);
  } else {
    Buffer out = Buffer::uninitialized(gathered.size(), MemTag::comm_buffers);
    convert_to_float(T::dtype, as_bits(gathered.span()), out.span());
    gathered.release();
    return out;
  }
}

/// A layer's gradient as backward computed it in fp32 (`grad`, tag comm_buffers), made the
/// gradient of T (rounded once: the 16-bit gradient backward writes) and then put in R for the
/// reduce: R = float, `grad` itself (moved out; in 16 bits its values rounded to T in place);
/// R = bf16/fp16, a new buffer of R (tag comm_buffers), and `grad` is freed.
template <Element T, Element R>
BufferOf<R> narrow_for_reduce(Buffer& grad) {
  if constexpr (std::is_same_v<R, float>) {
    if constexpr (!std::is_same_v<T, float>) round_in_place(T::dtype, grad.span());
    return std::move(grad);
  } else {
    BufferOf<R> out = BufferOf<R>::uninitialized(grad.size(), MemTag::comm_buffers);
    narrow_into<R>(grad.span(), out.span());
    grad.release();
    return out;
  }
}

/// The mean from the sum over ranks, in place on `sum` (a shard's elements): ÷N in fp32 training
/// (T float: after the sum, the bitwise chain to chapter 02); nothing in 16 bits (the backward
/// seed pre-divided by N, ShardOptimizer::seed).
template <Element T, Element R>
void mean_of_sum(std::span<R> sum, int world_size) {
  if constexpr (std::is_same_v<T, float>)
    for (R& g : sum) g /= static_cast<float>(world_size);
}

/// --reduce-dtype as a communication hook on a padded bucket of T (see the header). Holds, tag
/// comm_buffers: the collective's incoming chunk (R); when R differs from T, the bucket widened
/// to R and, if `kept` > 0, `kept` elements of R where reduced shards stay until the optimizer
/// step (a chapter that keeps its gradients whole: the fp32 sums of its shard).
template <Element T, Element R>
class ShardReduce {
 public:
  ShardReduce() = default;
  /// largest_bucket, largest_chunk: elements of the largest padded bucket and shard; kept: 0,
  /// or (R wider than T) the elements of every reduced shard the engine keeps (Σ s: ZeRO-1,
  /// whose gradients stay whole in T, keeps the fp32 sums of its shard here until the step).
  ShardReduce(int world_size, int64_t largest_bucket, int64_t largest_chunk, int64_t kept = 0)
      : world_size_(world_size), scratch_(largest_chunk, MemTag::comm_buffers) {
    if constexpr (!std::is_same_v<T, R>) {
      wide_ = BufferOf<R>(largest_bucket, MemTag::comm_buffers);
      if (kept > 0) kept_ = BufferOf<R>(kept, MemTag::comm_buffers);
    }
  }

  /// Sums `bucket` over ranks with the chapter's collective, sum(std::span<R> bucket,
  /// std::span<R> scratch) -> this rank's shard of it, and makes that shard the mean (fp32
  /// training: ÷N after the sum; 16 bits: the seed pre-divided). Returns the shard: inside
  /// `bucket` when R is T, else (widened first) at kept[kept_offset, + shard) when kept, or in
  /// the widened bucket, valid until the next reduce.
  template <class Sum>
  std::span<R> reduce(std::span<T> bucket, int64_t kept_offset, Sum&& sum) {
    std::span<R> shard;
    if constexpr (std::is_same_v<T, R>) {
      shard = sum(bucket, scratch_.span());
    } else {
      std::span<R> wide = wide_.span().first(bucket.size());
      convert_to_float(T::dtype, as_bits(std::span<const T>(bucket)), wide);  // exact
      shard = sum(wide, scratch_.span());
      if (kept_.size() > 0) {
        std::copy(shard.begin(), shard.end(), kept_.data() + kept_offset);
        shard = kept_.span().subspan(kept_offset, shard.size());
      }
    }
    mean_of_sum<T, R>(shard, world_size_);  // fp32: ÷N; 16 bits: pre-divided
    return shard;
  }

  /// The collective's scratch as T, for the parameters' all-gather (MPI's wants one, ≥ a
  /// shard): the reduce's own when R is T (the two never run at once); empty otherwise (16-bit
  /// parameters are gathered by the ring, which needs none).
  std::span<T> gather_scratch() {
    if constexpr (std::is_same_v<T, R>)
      return scratch_.span();
    else
      return {};
  }

  /// Where reduce() left a shard of a kept reduction: `in_place` (its real elements inside the
  /// bucket) when R is T, else kept[kept_offset, + in_place.size()).
  std::span<R> shard(std::span<T> in_place, int64_t kept_offset) {
    if constexpr (std::is_same_v<T, R>)
      return in_place;
    else
      return kept_.span().subspan(kept_offset, in_place.size());
  }

 private:
  int world_size_ = 1;
  BufferOf<R> scratch_, wide_, kept_;
};

/// Where forward and backward find parameter i (registration order) and its gradient, in an
/// engine's buffers of T. Construction moves every parameter of `model` to
/// params[offsets[i], + numel) and frees the model's own fp32 buffers (Model::num_parameters()
/// still reads Ψ). fp32: Parameter::data and grad are views into the engine's buffers. bf16/fp16:
/// HalfStorage (common/mixed.hpp): forward and backward read one layer's fp32 working copy and
/// backward adds each gradient, rounded, into the 16-bit gradient bound here; construct it
/// before any object whose gradient-ready hooks read the gradients. params must outlive it.
template <Element T>
class ParameterBinding {
 public:
  ParameterBinding(Model& model, std::span<T> params, const std::vector<int64_t>& offsets)
      : model_(model) {
    if constexpr (std::is_same_v<T, float>) {
      model.grads_memory.release();
      const auto& ps = model.parameters();
      for (size_t i = 0; i < ps.size(); ++i) {
        Parameter& p = *ps[i];
        float* data = params.data() + offsets[i];
        std::copy_n(p.data.data(), p.numel(), data);
        p.data = Tensor(data, p.shape());
        p.grad = Tensor();
      }
      model.params_memory.release();
    } else {
      half_ = std::make_unique<HalfStorage>(model, T::dtype, as_bits(params), offsets);
    }
  }
  ParameterBinding(const ParameterBinding&) = delete;
  ParameterBinding& operator=(const ParameterBinding&) = delete;

  /// From now on backward adds parameter i's gradient into `grad` (numel elements); empty:
  /// nowhere (a backward that reaches it stops with an error).
  void bind_grad(size_t i, std::span<T> grad) {
    if constexpr (std::is_same_v<T, float>) {
      Parameter& p = *model_.parameters()[i];
      p.grad = grad.empty() ? Tensor() : Tensor(grad.data(), p.shape());
    } else {
      half_->set_grad16(i, as_bits(grad));
    }
  }

 private:
  Model& model_;
  std::unique_ptr<HalfStorage> half_;  // bf16/fp16
};

/// Bytes per element of T on the wire and in memory: 4 (float) or 2 (bf16, fp16).
template <Element T>
constexpr int element_bytes() {
  return static_cast<int>(sizeof(T));
}

/// The model states' name in a ZeRO formula line: "fp32 + AdamW" (StateBytes::name) in fp32,
/// "bf16 + AdamW with fp32 master weights" in 16 bits.
template <Element T>
std::string zero_states_name(StateBytes b) {
  if constexpr (std::is_same_v<T, float>)
    return b.name;
  else
    return std::string(dtype_name(T::dtype)) + " + AdamW with fp32 master weights";
}
/// What a 16-bit run holds beside the model states (HalfStorage's), for the formula line.
template <Element T>
std::string zero_states_note() {
  if constexpr (std::is_same_v<T, float>)
    return "";
  else
    return "; plus one layer's fp32 working copy and gradient scratch (activations)";
}

}  // namespace ringzero
