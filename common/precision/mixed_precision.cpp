#include "common/precision/mixed_precision.hpp"

#include <cmath>

#include "common/core/check.hpp"
#include "common/driver/train.hpp"
#include "common/report/metrics.hpp"
#include "common/zero/zero_memory.hpp"

namespace ringzero {

namespace {

Dtype precision_dtype(const TrainConfig& config) {
  const Dtype d = parse_dtype(config.precision, "--precision");
  RZ_CHECK(d != Dtype::fp32, "MixedPrecision: --precision fp32 trains in fp32; nothing to do");
  RZ_CHECK(config.optimizer == "adamw",
           "--precision " << config.precision << " needs --optimizer adamw (fp32 master weights "
                          << "are kept for AdamW only)");
  return d;
}

}  // namespace

// --reduce-dtype, default the precision's. Which values are allowed is checked once, before any
// chapter is built (PrecisionCheck, common/driver/run.cpp): here it is only read.
Dtype reduce_dtype_of(const TrainConfig& config) {
  if (config.reduce_dtype.empty()) return parse_dtype(config.precision, "--precision");
  return parse_dtype(config.reduce_dtype, "--reduce-dtype");
}

MixedPrecision::MixedPrecision(Model& model, const TrainConfig& config, bool master_weights)
    : master_(master_weights
                  ? std::optional<MasterWeights>(std::in_place, precision_dtype(config),
                                                 model.params_memory.span(), parameter_sizes(model),
                                                 adamw_options(config))
                  : std::nullopt),
      storage_(model, precision_dtype(config)),
      reduce_dtype_(reduce_dtype_of(config)) {
  if (dtype() == Dtype::fp16) scaler_.emplace();
}

const MasterWeights& MixedPrecision::master() const {
  RZ_CHECK(master_, "MixedPrecision: this rank holds no master weights (chapter 03: rank 0 only)");
  return *master_;
}

bool MixedPrecision::found_inf(std::span<const float> grads32) const {
  if (!scaler_) return false;
  return grads32.empty() ? has_non_finite(dtype(), storage_.grads16.span())
                         : has_non_finite(grads32);
}

bool MixedPrecision::update_scale(bool found_inf, Communicator* comm) {
  if (!scaler_) return true;
  if (comm != nullptr) found_inf = found_inf_on_any_rank(*comm, found_inf);
  return scaler_->update(found_inf);  // false: skipped, Adam's step count stays
}

void MixedPrecision::step_master(float clip_grad_norm, std::span<const float> grads32) {
  RZ_CHECK(master_, "MixedPrecision::step_master: this rank holds no master weights");
  float factor = scaler_ ? scaler_->inv_scale() : 1.0f;
  if (clip_grad_norm > 0) {
    const double sum = grads32.empty()
                           ? sum_of_squares_half(dtype(), storage_.grads16.span(), factor)
                           : sum_of_squares(grads32, factor);
    factor *= clip_coefficient(std::sqrt(sum), clip_grad_norm);
  }
  if (grads32.empty())
    master_->step(storage_.params16.span(), storage_.grads16.span(), factor);
  else
    master_->step(storage_.params16.span(), grads32, factor);
}

bool MixedPrecision::step(float clip_grad_norm, Communicator* comm,
                          std::span<const float> grads32) {
  if (!update_scale(found_inf(grads32), comm)) return false;
  step_master(clip_grad_norm, grads32);
  return true;
}

void MixedPrecision::check_first_loss(double loss, int64_t step) const {
  check_fp16_first_loss(dtype(), loss, step);
}

void check_fp16_first_loss(Dtype dtype, double loss, int64_t step) {
  // At step 1 no update has happened yet: a non-finite loss is the forward overflowing the
  // 16-bit range (fp16's largest value is 65504), not a divergence that --lr could cure.
  RZ_CHECK(std::isfinite(loss) || step > 1 || dtype != Dtype::fp16,
           "loss is " << loss << " at step 1, before any update: the forward pass "
                      << "overflowed fp16's range (largest value 65504), e.g. with large "
                      << "--init-from weights. Use --precision bf16 (fp32's range) or fp32, "
                      << "or smaller initial weights");
}

std::map<std::string, NamedTensor> MixedPrecision::master_state_dict(const Model& model) const {
  std::map<std::string, NamedTensor> out;
  const auto& params = model.parameters();
  for (size_t i = 0; i < params.size(); ++i) {
    std::vector<float> values(static_cast<size_t>(params[i]->numel()));  // to the host
    copy_elements(master().master().subspan(static_cast<size_t>(model.offsets()[i]), values.size()),
                  std::span<float>(values));
    out[params[i]->name()] = {params[i]->shape(), std::move(values)};
  }
  return out;
}

nlohmann::json MixedPrecision::summary() const {
  nlohmann::json j{{"precision", dtype_name(dtype())}};
  if (scaler_) {
    j["loss_scale"] = scaler_->scale();
    j["skipped_steps"] = scaler_->skipped_steps();
  }
  return j;
}

std::string MixedPrecision::ledger_formula(Dtype dtype, int64_t psi) {
  return std::string("formula (one process, ") + dtype_name(dtype) +
         " + AdamW with fp32 master weights): " + full_copy_formula_text(kMixedPrecisionAdam) +
         " = " + human_bytes(kMixedPrecisionAdam.per_param() * static_cast<double>(psi)) +
         " with Ψ = " + std::to_string(psi) +
         "; plus one layer's fp32 working copy and gradient scratch (activations)";
}

std::unique_ptr<MixedPrecision> make_mixed_precision(Model& model, const TrainConfig& config,
                                                     bool master_weights) {
  if (config.precision == "fp32") return nullptr;
  return std::make_unique<MixedPrecision>(model, config, master_weights);
}

}  // namespace ringzero
