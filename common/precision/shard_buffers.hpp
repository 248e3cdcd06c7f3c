// shard_buffers: moving values between the buffers of an engine written over its element types
// (ZeRO, chapters 06-08; T the parameters', R the reduced gradient's,
// common/precision/shard_precision.hpp), written once so that no engine branches on them. Provides:
//  - ShardReduce<T, R>: --reduce-dtype as a communication hook (PyTorch's comm hooks): the
//    engine's reduce-scatter runs on a bucket in R (T widened exactly when they differ), and
//    fp32 training divides the shard's sum by N after it (the bitwise chain to chapter 02);
//  - ParameterBinding<T>: where forward and backward find parameter i and its gradient inside
//    the engine's buffers: fp32, Tensor views; bf16/fp16, HalfStorage's one-layer fp32 copy;
//  - for ZeRO-3, which gathers a layer for its compute: widen_for_compute (a gathered layer of T
//    as fp32), narrow_for_reduce (its fp32 gradient rounded to T, in R), mean_of_sum,
//    narrow_into; element_bytes.
// Leaves out: the optimizer (shard_precision.hpp), the collectives (the chapters').
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <span>
#include <type_traits>
#include <utility>
#include <vector>

#include "common/core/check.hpp"
#include "common/core/device_memory.hpp"
#include "common/core/half.hpp"
#include "common/core/ledger.hpp"
#include "common/core/nn.hpp"
#include "common/core/optim.hpp"
#include "common/driver/engine_description.hpp"
#include "common/precision/mixed.hpp"

namespace ringzero {

/// in[i] as T, into out (the same size): a copy for float (on the host or a device:
/// copy_elements); bf16/fp16 rounded to nearest even (convert_to_half, host or device). Errors: sizes
/// differ.
template <Element T>
void narrow_into(std::span<const float> in, std::span<T> out) {
  RZ_CHECK(in.size() == out.size(), "narrow_into: " << in.size() << " values into " << out.size());
  if constexpr (std::is_same_v<T, float>)
    copy_elements(in, out);
  else
    convert_to_half(T::dtype, in, as_bits(out));
}

/// The fp32 values a gathered layer computes with (ZeRO-3; autocast's fp32 copy): `gathered`
/// itself in fp32 (moved out); in bf16/fp16 a new fp32 buffer (tag comm_buffers, where `gathered`
/// lives) of the values widened (exactly), and `gathered` is freed.
template <Element T>
Buffer widen_for_compute(BufferOf<T>& gathered) {
  if constexpr (std::is_same_v<T, float>) {
    return std::move(gathered);
  } else {
    Buffer out = Buffer::uninitialized(gathered.size(), MemTag::comm_buffers, gathered.device());
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
    BufferOf<R> out = BufferOf<R>::uninitialized(grad.size(), MemTag::comm_buffers, grad.device());
    narrow_into<R>(grad.span(), out.span());
    grad.release();
    return out;
  }
}

/// The mean from the sum over ranks, in place on `sum` (a shard's elements): ÷N in fp32 training
/// (T float, so R float: after the sum, a division, the bitwise chain to chapter 02;
/// divide_in_place runs where `sum` lives); nothing in 16 bits (the backward seed pre-divided
/// by N, ShardOptimizer::seed).
template <Element T, Element R>
void mean_of_sum(std::span<R> sum, int world_size) {
  if constexpr (std::is_same_v<T, float>) divide_in_place(sum, static_cast<float>(world_size));
}

/// --reduce-dtype as a communication hook on a padded bucket of T (see the header). Holds, tag
/// comm_buffers, on the engine's device: the collective's incoming chunk (R); when R differs
/// from T, the bucket widened to R and, if `kept` > 0, `kept` elements of R where reduced
/// shards stay until the optimizer step (a chapter that keeps its gradients whole: the fp32
/// sums of its shard).
template <Element T, Element R>
class ShardReduce {
 public:
  ShardReduce() = default;
  /// largest_bucket, largest_chunk: elements of the largest padded bucket and shard; kept: 0,
  /// or (R wider than T) the elements of every reduced shard the engine keeps (Σ s: ZeRO-1,
  /// whose gradients stay whole in T, keeps the fp32 sums of its shard here until the step).
  /// device: where the engine's buckets live.
  ShardReduce(int world_size, int64_t largest_bucket, int64_t largest_chunk, int64_t kept = 0,
              Device device = Device::cpu)
      : world_size_(world_size), scratch_(largest_chunk, MemTag::comm_buffers, device) {
    if constexpr (!std::is_same_v<T, R>) {
      wide_ = BufferOf<R>(largest_bucket, MemTag::comm_buffers, device);
      if (kept > 0) kept_ = BufferOf<R>(kept, MemTag::comm_buffers, device);
    }
  }
  /// The same, sized for the units of an engine's description `d`: the largest padded unit
  /// (N·s) and the largest shard s.
  ShardReduce(const EngineDescription& d, int64_t kept, Device device)
      : ShardReduce(d.world_size, d.world_size * largest_shard(d.units), largest_shard(d.units),
                    kept, device) {}

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
        std::span<R> kept = kept_.span().subspan(kept_offset, shard.size());
        copy_elements(shard, kept);
        shard = kept;
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
/// HalfStorage (common/precision/mixed.hpp): forward and backward read one layer's fp32 working
/// copy and backward adds each gradient, rounded, into the 16-bit gradient bound here; construct it
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
        std::span<float> data = params.subspan(offsets[i], p.numel());
        copy_elements(p.data.span(), data);  // from the model's memory, host or device
        p.data = Tensor(data.data(), p.shape());
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
  /// bind_grad(i, ...) at buffer[offset, + parameter i's numel).
  void bind_grad(size_t i, std::span<T> buffer, int64_t offset) {
    bind_grad(i, buffer.subspan(static_cast<size_t>(offset),
                                static_cast<size_t>(model_.parameters()[i]->numel())));
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

}  // namespace ringzero
