#include "common/core/optim.hpp"

#include <cmath>
#include <numeric>
#include <utility>
#include <variant>

#include "common/core/check.hpp"
#include "common/core/device_backend.hpp"
#include "common/core/kernels.hpp"

namespace ringzero {

AdamW::AdamW(std::vector<int64_t> segment_sizes, AdamWOptions options)
    : sizes_(std::move(segment_sizes)), steps_(sizes_.size(), 0), options_(options) {
  RZ_CHECK(options.lr > 0, "AdamW lr = " << options.lr << "; use a positive --lr");
  RZ_CHECK(options.beta1 >= 0 && options.beta1 < 1 && options.beta2 >= 0 && options.beta2 < 1,
           "AdamW betas (" << options.beta1 << ", " << options.beta2 << ") must lie in [0, 1)");
  RZ_CHECK(options.eps > 0, "AdamW eps = " << options.eps << " must be positive");
  RZ_CHECK(options.weight_decay >= 0,
           "weight decay = " << options.weight_decay << "; use --weight-decay >= 0");
  const int64_t total = std::accumulate(sizes_.begin(), sizes_.end(), int64_t{0});
  exp_avg_ = Buffer(total, MemTag::optimizer_state);
  exp_avg_sq_ = Buffer(total, MemTag::optimizer_state);
}

kernels::AdamWStep adamw_step_constants(const AdamWOptions& o, int64_t t) {
  // In double, as torch (Python floats): 1 - beta2^t cancels catastrophically in float32
  // (relative error ~1e-5 for small t, e.g. t = 2), which would move every update by as much.
  const double bias_correction1 =
      1.0 - std::pow(static_cast<double>(o.beta1), static_cast<double>(t));
  const double bias_correction2 =
      1.0 - std::pow(static_cast<double>(o.beta2), static_cast<double>(t));
  return {.decay = 1.0f - o.lr * o.weight_decay,
          .beta1 = o.beta1,
          .beta2 = o.beta2,
          .eps = o.eps,
          .step_size = static_cast<float>(o.lr / bias_correction1),
          .bias_correction2_sqrt = static_cast<float>(std::sqrt(bias_correction2))};
}

void AdamW::step(std::span<float> params, std::span<const float> grads) {
  RZ_CHECK(params.size() == grads.size() && static_cast<int64_t>(params.size()) == exp_avg_.size(),
           "AdamW::step: " << params.size() << " params, " << grads.size() << " grads, state for "
                           << exp_avg_.size());
  const AdamWOptions& o = options_;
  exp_avg_.to(device_of(params.data()));  // the state lives where the parameters do (PyTorch)
  exp_avg_sq_.to(device_of(params.data()));
  float* m = exp_avg_.data();
  float* v = exp_avg_sq_.data();
  int64_t begin = 0;
  for (size_t s = 0; s < sizes_.size(); ++s) {
    [[maybe_unused]] const int64_t t = ++steps_[s];  // this segment's own count (unused by a stub)
    // BEGIN EXERCISE 01.3 (AdamW step: one segment)
    const kernels::AdamWStep k = adamw_step_constants(o, t);
    adamw_update(params.data() + begin, m + begin, v + begin, grads.data() + begin, sizes_[s], k);
    // END EXERCISE 01.3
    begin += sizes_[s];
  }
}

void adamw_update(float* p, float* m, float* v, const float* g, int64_t n,
                  const kernels::AdamWStep& k) {
  if (DeviceBackend* d = backend_of({p, m, v, g})) return d->adamw_update(p, m, v, g, n, k);
  for (int64_t i = 0; i < n; ++i)
    kernels::adamw_update(p[i], m[i], v[i], g[i], k);  // the formula (kernels.hpp): the GPU's too
}

SGD::SGD(int64_t size, SGDOptions options) : options_(options) {
  RZ_CHECK(options.lr > 0, "SGD lr = " << options.lr << "; use a positive --lr");
  RZ_CHECK(options.momentum >= 0, "SGD momentum = " << options.momentum << " must be >= 0");
  RZ_CHECK(options.weight_decay >= 0,
           "weight decay = " << options.weight_decay << "; use --weight-decay >= 0");
  if (options.momentum > 0) momentum_buffer_ = Buffer(size, MemTag::optimizer_state);
}

void SGD::step(std::span<float> params, std::span<const float> grads) {
  RZ_CHECK(params.size() == grads.size(),
           "SGD::step: " << params.size() << " params, " << grads.size() << " grads");
  const SGDOptions& o = options_;
  momentum_buffer_.to(device_of(params.data()));  // where the parameters are, as AdamW's state
  sgd_update(params.data(), momentum_buffer_.data(), grads.data(),
             static_cast<int64_t>(params.size()), o.lr, o.momentum, o.weight_decay, first_step_);
  first_step_ = false;
}

void sgd_update(float* p, float* buf, const float* g, int64_t n, float lr, float momentum,
                float weight_decay, bool first_step) {
  if (DeviceBackend* d = backend_of({p, buf, g}))
    return d->sgd_update(p, buf, g, n, lr, momentum, weight_decay, first_step);
  float no_buffer = 0.0f;  // sgd_update ignores buf without momentum
  for (int64_t i = 0; i < n; ++i)
    kernels::sgd_update(p[i], momentum > 0 ? buf[i] : no_buffer, g[i], lr, momentum, weight_decay,
                        first_step);
}

static std::variant<AdamW, SGD> make_optimizer(const OptimizerOptions& c,
                                               std::vector<int64_t> sizes) {
  if (c.name == "sgd") {
    int64_t total = 0;
    for (int64_t s : sizes) total += s;
    return std::variant<AdamW, SGD>(std::in_place_type<SGD>, total,
                                    SGDOptions{c.lr, c.momentum, c.weight_decay});
  }
  AdamWOptions o;
  o.lr = c.lr;
  o.weight_decay = c.weight_decay;
  return std::variant<AdamW, SGD>(std::in_place_type<AdamW>, std::move(sizes), o);
}

Optimizer::Optimizer(const OptimizerOptions& c, std::vector<int64_t> segment_sizes)
    : impl_(make_optimizer(c, std::move(segment_sizes))) {}

void Optimizer::step(std::span<float> params, std::span<const float> grads) {
  std::visit([&](auto& opt) { opt.step(params, grads); }, impl_);
}

double sum_of_squares(std::span<const float> grads) {
  if (DeviceBackend* d = backend_of({grads.data()}))
    return d->sum_of_squares(grads.data(), static_cast<int64_t>(grads.size()), 1.0f);
  double s = 0.0;
  for (float g : grads) s += kernels::square(g);
  return s;
}

float clip_coefficient(double total_norm, float max_norm) {
  return static_cast<float>(std::min(1.0, max_norm / (total_norm + 1e-6)));
}

void scale_in_place(std::span<float> grads, float coef) {
  if (DeviceBackend* d = backend_of({grads.data()}))
    return d->scale(grads.data(), static_cast<int64_t>(grads.size()), coef);
  for (float& g : grads) g *= coef;
}

void divide_in_place(std::span<float> grads, float divisor) {
  if (DeviceBackend* d = backend_of({grads.data()}))
    return d->divide(grads.data(), static_cast<int64_t>(grads.size()), divisor);
  for (float& g : grads) g /= divisor;
}

double clip_grad_norm(std::span<float> grads, float max_norm) {
  RZ_CHECK(max_norm > 0, "max grad norm = " << max_norm << "; use --clip-grad-norm > 0");
  const double norm = std::sqrt(sum_of_squares(grads));
  const float coef = clip_coefficient(norm, max_norm);
  if (coef < 1.0f) scale_in_place(grads, coef);
  return norm;
}

}  // namespace ringzero
