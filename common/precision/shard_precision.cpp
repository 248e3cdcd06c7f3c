#include "common/precision/shard_precision.hpp"

#include "common/core/check.hpp"

namespace ringzero {

ShardOptimizer::ShardOptimizer(const Model& model, const TrainConfig& config,
                               const std::vector<ShardPiece>& pieces, int world_size)
    : dtype_(parse_dtype(config.precision, "--precision")),
      reduce_dtype_(reduce_dtype_of(config)),
      world_size_(world_size),
      clip_grad_norm_(config.clip_grad_norm),
      state_bytes_(dtype_ == Dtype::fp32 ? fp32_state_bytes(config.optimizer, config.momentum)
                                         : kMixedPrecisionAdam) {
  if (dtype_ == Dtype::fp32) {
    optimizers_.reserve(pieces.size());
    for (const ShardPiece& piece : pieces) optimizers_.emplace_back(config, piece.segments);
    return;
  }
  RZ_CHECK(config.optimizer == "adamw",
           "--precision " << config.precision << " keeps fp32 master weights for AdamW only; "
                          << "use --optimizer adamw or --precision fp32");
  RZ_CHECK(model.params_memory.size() == model.num_parameters(),
           "ShardOptimizer: the model's fp32 parameters are already released");
  masters_.reserve(pieces.size());
  for (const ShardPiece& piece : pieces) {
    int64_t real = 0;
    for (int64_t s : piece.segments) real += s;
    std::span<const float> initial;  // a shard of padding only reads nothing (offset past Ψ)
    if (real > 0)
      initial = model.params_memory.span().subspan(static_cast<size_t>(piece.model_offset),
                                                   static_cast<size_t>(real));
    masters_.emplace_back(dtype_, initial, piece.segments, adamw_options(config));
  }
  if (dtype_ == Dtype::fp16) scaler_.emplace();
}

float ShardOptimizer::seed(int64_t grad_accum_steps) const {
  if (dtype_ == Dtype::fp32) return 1.0f / static_cast<float>(grad_accum_steps);
  return 1.0f / static_cast<float>(world_size_ * grad_accum_steps) * loss_scale();
}

void ShardOptimizer::check_first_loss(double loss, int64_t step) const {
  check_fp16_first_loss(dtype_, loss, step);
}

std::span<const float> ShardOptimizer::master(size_t u) const {
  RZ_CHECK(dtype_ != Dtype::fp32,
           "master weights: an fp32 run has none (its parameters are the "
           "state)");
  return masters_[u].master();
}

const AdamW& ShardOptimizer::adamw(size_t u) const {
  const AdamW* a = optimizers_[u].adamw();
  RZ_CHECK(a != nullptr, "optimizer state is saved for --optimizer adamw only");
  return *a;
}

std::span<const float> ShardOptimizer::exp_avg(size_t u) const {
  return masters_.empty() ? adamw(u).exp_avg() : masters_[u].exp_avg();
}
std::span<const float> ShardOptimizer::exp_avg_sq(size_t u) const {
  return masters_.empty() ? adamw(u).exp_avg_sq() : masters_[u].exp_avg_sq();
}
const std::vector<int64_t>& ShardOptimizer::segment_steps(size_t u) const {
  return masters_.empty() ? adamw(u).segment_steps() : masters_[u].segment_steps();
}

StatePiece ShardOptimizer::state_piece(size_t u, std::span<float> params, int64_t global_offset,
                                       std::vector<int> segment_params) {
  if (masters_.empty()) return {params, global_offset, &optimizers_.at(u), std::move(segment_params)};
  MasterWeights& m = masters_.at(u);
  return {m.master(), global_offset, nullptr, std::move(segment_params), &m};
}

nlohmann::json ShardOptimizer::summary() const {
  if (dtype_ == Dtype::fp32) return nlohmann::json::object();
  nlohmann::json j{{"precision", dtype_name(dtype_)}, {"reduce_dtype", dtype_name(reduce_dtype_)}};
  if (scaler_) {
    j["loss_scale"] = scaler_->scale();
    j["skipped_steps"] = scaler_->skipped_steps();
  }
  return j;
}

}  // namespace ringzero
