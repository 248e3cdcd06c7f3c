#include "common/precision/precision.hpp"

#include "common/core/check.hpp"
#include "common/core/step_time.hpp"
#include "common/driver/train.hpp"
#include "common/report/metrics.hpp"

namespace ringzero {

ReplicatedPrecision::ReplicatedPrecision(Model& model, const TrainConfig& config, int world_size,
                                         bool holds_optimizer)
    : model_(model),
      world_size_(world_size),
      psi_(model.num_parameters()),
      clip_grad_norm_(config.clip_grad_norm),
      states_(fp32_state_bytes(config.optimizer, config.momentum)),
      mixed_(make_mixed_precision(model, config, holds_optimizer)) {
  if (!mixed_ && holds_optimizer) optimizer_.emplace(config, parameter_sizes(model));
}

void ReplicatedPrecision::reserve_scratch(int64_t chunk) {
  const Dtype reduce = mixed_ ? mixed_->reduce_dtype() : Dtype::fp32;
  if (reduce == Dtype::fp32) scratch32_ = Buffer(chunk, MemTag::comm_buffers, model_.device());
  if (reduce == Dtype::bf16)
    scratch_bf16_ = BufferOf<bf16>(chunk, MemTag::comm_buffers, model_.device());
  if (reduce == Dtype::fp16)
    scratch_fp16_ = BufferOf<fp16>(chunk, MemTag::comm_buffers, model_.device());
  if (mixed_ && reduce == Dtype::fp32)
    grads32_ = Buffer(psi_, MemTag::comm_buffers, model_.device());
}

void ReplicatedPrecision::zero_grad() {
  if (mixed_)
    mixed_->zero_grad();
  else
    model_.zero_grad();
}

float ReplicatedPrecision::seed(int64_t grad_accum_steps) const {
  if (!mixed_) return 1.0f / static_cast<float>(grad_accum_steps);
  return 1.0f / static_cast<float>(world_size_ * grad_accum_steps) * mixed_->loss_scale();
}

void ReplicatedPrecision::check_first_loss(double loss, int64_t step) const {
  if (mixed_) mixed_->check_first_loss(loss, step);
}

bool ReplicatedPrecision::step(Communicator* comm, bool holds_sum) {
  const PartScope part(StepPart::optimizer);  // --attribute
  const auto span = span_if(tracer_, "optimizer step", "optimizer");
  if (!mixed_) {
    if (!holds_sum) return false;
    RZ_CHECK(optimizer_, "ReplicatedPrecision::step: this rank holds no optimizer");
    std::span<float> grads = model_.grads_memory.span();
    if (clip_grad_norm_ > 0) clip_grad_norm(grads, clip_grad_norm_);
    optimizer_->step(model_.params_memory.span(), grads);
    return true;
  }
  // fp16: the overflow verdict of the ranks holding the sum, OR-ed over every rank.
  const bool found_inf = holds_sum && mixed_->found_inf(grads32_.span());
  if (!mixed_->update_scale(found_inf, comm)) return false;  // skipped on every rank
  if (holds_sum) mixed_->step_master(clip_grad_norm_, grads32_.span());
  return true;
}

int ReplicatedPrecision::grad_wire_bytes() const {
  return mixed_ && mixed_->reduce_dtype() != Dtype::fp32 ? 2 : 4;
}

void ReplicatedPrecision::check_collectives(Collectives collectives) const {
  const std::string d = dtype_name(dtype());
  RZ_CHECK(grad_wire_bytes() == 4 || collectives == Collectives::ring,
           "--collectives mpi with --reduce-dtype "
               << d << " (--reduce-dtype defaults to the --precision): MPI has no " << d
               << " sum; use --reduce-dtype fp32 (widen and sum in fp32) or --collectives ring");
}

std::string ReplicatedPrecision::replicated_ledger_formula(const std::string& unit) const {
  const double psi = static_cast<double>(psi_);
  if (!mixed_)
    return "formula (" + std::string(states_.name) + ", every rank): " +
           full_copy_formula_text(states_) + " = " + human_bytes(states_.per_param() * psi) +
           "; comm_buffers: one chunk of the largest " + unit;
  return "formula (" + std::string(dtype_name(dtype())) +
         " + AdamW with fp32 master weights, every rank): " +
         full_copy_formula_text(kMixedPrecisionAdam) + " = " +
         human_bytes(kMixedPrecisionAdam.per_param() * psi) + "; comm_buffers: " +
         (grad_wire_bytes() == 2 ? "one 16-bit chunk of the largest " + unit
                                 : "the gradient widened to fp32, 4Ψ, and one fp32 chunk of the "
                                   "largest " + unit) +
         "; activations: one layer's fp32 working copy and gradient scratch";
}

Optimizer& ReplicatedPrecision::optimizer() {
  RZ_CHECK(optimizer_, "ReplicatedPrecision: no fp32 optimizer on this rank (16 bits steps the "
                       "master weights; chapter 03 steps on rank 0 only)");
  return *optimizer_;
}

TrainingState ReplicatedPrecision::training_state(Model& model) {
  if (!mixed_) return replicated_state(model, optimizer_ ? &*optimizer_ : nullptr, "");
  TrainingState state = replicated_state(model, nullptr, "");
  StatePiece& piece = state.pieces.at(0);
  piece.master = mixed_->master_if_held();
  piece.params = piece.master ? piece.master->master() : std::span<float>();
  state.scaler = mixed_->scaler();
  state.load_params = [this](std::span<const float> params) {
    convert_to_half(mixed_->dtype(), params, mixed_->storage().params16.span());
  };
  return state;
}

nlohmann::json ReplicatedPrecision::summary() const {
  return mixed_ ? mixed_->summary() : nlohmann::json::object();
}

std::map<std::string, NamedTensor> ReplicatedPrecision::state_dict(const Model& model) const {
  if (!mixed_) return ringzero::state_dict(model);
  return mixed_->has_master_weights() ? mixed_->master_state_dict(model)
                                      : std::map<std::string, NamedTensor>{};
}

}  // namespace ringzero
