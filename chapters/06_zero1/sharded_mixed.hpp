// Mixed precision on ZeRO's shards (chapters 06-07, --precision bf16|fp16): the ZeRO paper's
// walk-through (Rajbhandari et al. 2020, §3.1 and §5.1): 16-bit parameters and gradients on
// every rank, and on each rank the fp32 master weights and AdamW moments of its shard only
// (K = 12 bytes per element: 12Ψ/N per rank), updated from the fp32-converted, unscaled and
// clipped gradient shard, and written back rounded to 16 bits before the all-gather.
//
// ShardedMixedPrecision holds, per bucket, a MasterWeights over this rank's real shard elements
// (the segments of the fp32 Optimizer it replaces), the fp16 GradScaler, and the two dtypes
// (--precision, --reduce-dtype). The engines (zero.hpp of chapters 06 and 07) own the 16-bit
// buffers and the collectives. The order of one 16-bit optimizer step, on every rank:
//   1. fp16: has_non_finite over this rank's gradient shard, OR-ed over every rank
//      (found_inf_on_any_rank): on overflow every rank skips the step — no MasterWeights::step,
//      so no shard's AdamW step count advances, no all-gather — and the scale halves;
//   2. clipping: every rank's Σ(g/scale)² over its shard, added in rank order (as
//      sharded_clip.hpp does in fp32), torch.nn.utils.clip_grad_norm_'s coefficient;
//   3. per bucket: MasterWeights::step(params16 shard, grads16 shard, factor = 1/scale · coef),
//      then the 16-bit all-gather of the bucket (the engine's).
// The backward seed is loss_scale/(N·K): each rank's 16-bit gradient is pre-divided by N, as
// PyTorch's DDP Reducer multiplies every gradient by 1/world_size before its all-reduce, so the
// reduce-scatter's 16-bit sum is the mean (nothing is divided after it) and cannot overflow by
// a factor of N.
// Leaves out: the buffers and collectives (zero.hpp), SGD in 16 bits (AdamW only, as chapter 01).
#pragma once

#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "chapters/06_zero1/optimizer_state.hpp"
#include "chapters/06_zero1/shard.hpp"
#include "common/check.hpp"
#include "common/comm.hpp"
#include "common/config.hpp"
#include "common/mixed.hpp"
#include "common/optim.hpp"
#include "common/zero_memory.hpp"

namespace ringzero {

/// Whether --precision asks for 16 bits (bf16 | fp16), and which (fp32: no).
inline std::optional<Dtype> sixteen_bit_precision(const TrainConfig& config) {
  const Dtype d = parse_dtype(config.precision, "--precision");
  if (d == Dtype::fp32) return std::nullopt;
  return d;
}

/// This rank's fp32 master weights and AdamW moments of its shard, per bucket, and the fp16
/// loss scaler. Memory: 12 bytes per real shard element (tag optimizer_state).
class ShardedMixedPrecision {
 public:
  /// Reads this rank's real shard elements of every bucket from the model's fp32 parameters
  /// (call before HalfStorage frees them). Errors: --precision fp32; --optimizer not adamw; a
  /// --reduce-dtype that is neither fp32 nor the precision's; the model's buffers released.
  ShardedMixedPrecision(const Model& model, const ShardLayout& layout, int rank,
                        const TrainConfig& config)
      : dtype_(parse_dtype(config.precision, "--precision")),
        reduce_dtype_(config.reduce_dtype.empty()
                          ? dtype_
                          : parse_dtype(config.reduce_dtype, "--reduce-dtype")) {
    RZ_CHECK(dtype_ != Dtype::fp32, "ShardedMixedPrecision: --precision fp32 needs no masters");
    RZ_CHECK(config.optimizer == "adamw",
             "--precision " << config.precision << " keeps fp32 master weights for AdamW only; "
                            << "use --optimizer adamw or --precision fp32");
    RZ_CHECK(reduce_dtype_ == dtype_ || reduce_dtype_ == Dtype::fp32,
             "--reduce-dtype " << config.reduce_dtype << " with --precision " << config.precision
                               << ": gradients are summed in the parameters' dtype or in fp32; "
                               << "use --reduce-dtype " << config.precision << " or fp32");
    RZ_CHECK(model.params_memory.size() == model.num_parameters(),
             "ShardedMixedPrecision: the model's fp32 parameters are already released");
    AdamWOptions options;
    options.lr = config.lr;
    options.weight_decay = config.weight_decay;
    masters_.reserve(layout.buckets.size());
    for (const BucketShard& s : layout.buckets) {
      // This rank's real elements of the bucket, in the model's unpadded layout (contiguous).
      const auto first = static_cast<size_t>(s.offset + rank * s.shard_size);
      masters_.emplace_back(dtype_,
                            model.params_memory.span().subspan(first, static_cast<size_t>(s.real)),
                            s.segments, options);
    }
    if (dtype_ == Dtype::fp16) scaler_.emplace();
  }

  Dtype dtype() const { return dtype_; }
  /// The dtype the reduce-scatter sums in: --reduce-dtype, default the --precision's.
  Dtype reduce_dtype() const { return reduce_dtype_; }
  /// The GradScaler's scale in fp16, 1 in bf16.
  float loss_scale() const { return scaler_ ? scaler_->scale() : 1.0f; }
  /// Backward's seed: loss_scale/(N·K), the mean over ranks pre-divided (see the header).
  float backward_seed(int world_size, int64_t grad_accum_steps) const {
    return 1.0f / static_cast<float>(world_size * grad_accum_steps) * loss_scale();
  }

  /// Collective, steps 1 and 2 of the header: `grads` are this rank's real gradient shard
  /// elements, every bucket. Returns whether to step (false on every rank alike after an fp16
  /// overflow anywhere; the scale is updated), and sets `factor` to what MasterWeights::step
  /// multiplies the 16-bit gradients by (1/scale times the clip coefficient).
  bool decide(Communicator& comm, const std::vector<std::span<const uint16_t>>& grads,
              float clip_grad_norm, float& factor) {
    factor = scaler_ ? scaler_->inv_scale() : 1.0f;
    if (scaler_) {
      bool found_inf = false;
      for (std::span<const uint16_t> g : grads) found_inf = found_inf || has_non_finite(dtype_, g);
      if (!scaler_->update(found_inf_on_any_rank(comm, found_inf))) return false;
    }
    if (clip_grad_norm > 0) {
      std::vector<double> sums(static_cast<size_t>(comm.world_size()), 0.0);  // (N) Σ g²
      for (std::span<const uint16_t> g : grads)
        sums[comm.rank()] += sum_of_squares_half(dtype_, g, factor);
      comm.all_reduce_metrics(sums);
      double total = 0;
      for (double v : sums) total += v;  // rank order, on every rank: the same norm
      factor *= clip_coefficient(std::sqrt(total), clip_grad_norm);
    }
    return true;
  }

  /// fp16: a non-finite loss at step 1, before any update, is the forward overflowing fp16's
  /// range (e.g. large --init-from weights), not a divergence: stops with a message naming the
  /// fix. Call on every rank with the global mean loss, so every rank stops.
  void check_first_loss(double loss, int64_t step) const {
    RZ_CHECK(std::isfinite(loss) || step > 1 || dtype_ != Dtype::fp16,
             "loss is " << loss << " at step 1, before any update: the forward pass "
                        << "overflowed fp16's range (largest value 65504), e.g. with large "
                        << "--init-from weights. Use --precision bf16 (fp32's range) or fp32, "
                        << "or smaller initial weights");
  }

  /// Bucket b's master weights and moments (this rank's real shard elements).
  MasterWeights& bucket(size_t b) { return masters_[b]; }
  const std::vector<MasterWeights>& buckets() const { return masters_; }

  /// Collective: the fp32 master weights, gathered whole under the model's state_dict() names
  /// (--save-final).
  std::map<std::string, NamedTensor> master_state_dict(Communicator& comm, const Model& model,
                                                       const ShardLayout& layout) const {
    return gather_shard_states(
        comm, model, layout, {""}, [&](size_t b, size_t) { return masters_[b].master(); },
        [](size_t) { return static_cast<const std::vector<int64_t>*>(nullptr); });
  }
  /// Collective: AdamW's moments and step counts, gathered whole as gather_optimizer_state
  /// names them (--save-optimizer-state).
  std::map<std::string, NamedTensor> optimizer_state_dict(Communicator& comm, const Model& model,
                                                          const ShardLayout& layout) const {
    return gather_shard_states(
        comm, model, layout, {".exp_avg", ".exp_avg_sq"},
        [&](size_t b, size_t which) {
          return which == 0 ? masters_[b].exp_avg() : masters_[b].exp_avg_sq();
        },
        [&](size_t b) { return &masters_[b].segment_steps(); });
  }

  /// "precision", "reduce_dtype", and in fp16 "loss_scale" and "skipped_steps".
  nlohmann::json summary() const {
    nlohmann::json j{{"precision", dtype_name(dtype_)},
                     {"reduce_dtype", dtype_name(reduce_dtype_)}};
    if (scaler_) {
      j["loss_scale"] = scaler_->scale();
      j["skipped_steps"] = scaler_->skipped_steps();
    }
    return j;
  }

 private:
  Dtype dtype_, reduce_dtype_;
  std::vector<MasterWeights> masters_;  // (buckets) each over this rank's real shard elements
  std::optional<GradScaler> scaler_;    // fp16 only
};

}  // namespace ringzero
