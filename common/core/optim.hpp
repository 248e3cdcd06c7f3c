// optim: SGD and AdamW with PyTorch's semantics, over flat spans, and gradient clipping.
//
// Provides: Optimizer (--optimizer adamw|sgd, the one every chapter builds), SGD (momentum,
// dampening 0, weight decay added to the gradient, as torch.optim.SGD), AdamW
// (torch.optim.AdamW 1.13, single-tensor path: decoupled weight decay, bias correction with a
// per-parameter step count), global-norm clipping (torch.nn.utils.clip_grad_norm_).
// Both optimizers update a flat span of parameters from a flat span of gradients of the same
// length; a ZeRO shard is simply a shorter span. The span is split into segments (normally
// one per parameter, or the part of a parameter inside a shard), each with its own step count.
// The updates run where the spans live (the host, or a device: adamw_update and sgd_update
// dispatch, common/core/device_backend.hpp), and the optimizer's state follows the parameters
// there. Leaves out: parameter groups, amsgrad, maximize, nesterov, learning-rate schedules.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <variant>
#include <vector>

#include "common/core/ledger.hpp"

namespace ringzero {

// Declared, not included: common/core/kernels.hpp holds the solution regions of exercises
// 01.1-01.3, and every chapter includes this header, so including it here would make
// `scripts/exercise check 01.x` rebuild nearly all of common/ after each edit.
namespace kernels {
struct AdamWStep;
}

/// torch.optim.AdamW defaults.
struct AdamWOptions {
  float lr = 1e-3f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 1e-2f;
};

/// The constants of AdamW's update at step t (bias corrections in float64, as torch), shared by
/// AdamW::step and the GPU kernel.
kernels::AdamWStep adamw_step_constants(const AdamWOptions& options, int64_t t);

class AdamW {
 public:
  /// segment_sizes: element counts of the segments, in span order; they must sum to the span
  /// length passed to step(). exp_avg and exp_avg_sq (2 x 4 bytes per element) are tagged
  /// optimizer_state. Errors: a non-positive lr, betas outside [0, 1), eps <= 0, wd < 0.
  AdamW(std::vector<int64_t> segment_sizes, AdamWOptions options = {});

  /// One update: for each element, with t the segment's step count after increment,
  ///   p -= lr * wd * p;  m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g²;
  ///   p -= lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps).
  void step(std::span<float> params, std::span<const float> grads);

  const AdamWOptions& options() const { return options_; }
  std::span<const float> exp_avg() const { return exp_avg_.span(); }
  std::span<const float> exp_avg_sq() const { return exp_avg_sq_.span(); }
  const std::vector<int64_t>& segment_steps() const { return steps_; }
  /// Writable state, for loading a checkpoint (common/io/checkpoint.hpp): the moments and each
  /// segment's step count (torch.optim.Optimizer.load_state_dict's state["step"]).
  std::span<float> exp_avg() { return exp_avg_.span(); }
  std::span<float> exp_avg_sq() { return exp_avg_sq_.span(); }
  std::vector<int64_t>& segment_steps() { return steps_; }
  const std::vector<int64_t>& segment_sizes() const { return sizes_; }

 private:
  std::vector<int64_t> sizes_, steps_;
  AdamWOptions options_;
  Buffer exp_avg_, exp_avg_sq_;
};

struct SGDOptions {
  float lr = 1e-2f;
  float momentum = 0.0f;
  float weight_decay = 0.0f;
};

class SGD {
 public:
  /// A momentum buffer (tag optimizer_state) of `size` elements exists only if momentum > 0.
  SGD(int64_t size, SGDOptions options);
  /// g' = g + wd p;  buf = g' on the first step, else momentum buf + g';  p -= lr buf.
  void step(std::span<float> params, std::span<const float> grads);

  /// The momentum buffer (empty without momentum), and whether a step was taken (the next
  /// step then blends into the buffer instead of setting it); for checkpoints.
  std::span<float> momentum_buffer() { return momentum_buffer_.span(); }
  bool started() const { return !first_step_; }
  void set_started(bool started) { first_step_ = !started; }

 private:
  SGDOptions options_;
  Buffer momentum_buffer_;
  bool first_step_ = true;
};

/// The optimizer's flags: --optimizer (name: adamw | sgd), --lr, --weight-decay, --momentum (SGD
/// only). TrainConfig converts to it (common/driver/config.hpp), so core/ knows no command line.
struct OptimizerOptions {
  std::string name = "adamw";
  float lr = 1e-3f;
  float weight_decay = 1e-2f;
  float momentum = 0.0f;
};

/// --optimizer adamw|sgd (`options`) over a flat span cut into segments (one per parameter, or
/// per parameter piece of a shard), each with its own step count: the optimizer every chapter
/// builds. Errors: AdamW's and SGD's (bad lr etc.).
class Optimizer {
 public:
  Optimizer(const OptimizerOptions& options, std::vector<int64_t> segment_sizes);
  void step(std::span<float> params, std::span<const float> grads);
  /// AdamW's state (exp_avg, exp_avg_sq), empty for SGD; for the equivalence tests.
  const AdamW* adamw() const { return std::get_if<AdamW>(&impl_); }
  AdamW* adamw() { return std::get_if<AdamW>(&impl_); }
  SGD* sgd() { return std::get_if<SGD>(&impl_); }

 private:
  std::variant<AdamW, SGD> impl_;
};

/// The AdamW update of n elements, kernels::adamw_update on each (AdamW::step calls it per
/// segment), on the host or on the device that holds the four arrays.
void adamw_update(float* p, float* m, float* v, const float* g, int64_t n,
                  const kernels::AdamWStep& k);
/// The SGD update of n elements, kernels::sgd_update on each; buf may be null without momentum.
void sgd_update(float* p, float* buf, const float* g, int64_t n, float lr, float momentum,
                float weight_decay, bool first_step);
/// Σ g², accumulated in float64.
double sum_of_squares(std::span<const float> grads);
/// The factor clip_grad_norm_ scales gradients by: min(1, max_norm / (total_norm + 1e-6)).
float clip_coefficient(double total_norm, float max_norm);
/// g *= coef.
void scale_in_place(std::span<float> grads, float coef);
/// g /= divisor (the mean over ranks; a division, so not scale_in_place by 1/divisor's bits).
void divide_in_place(std::span<float> grads, float divisor);
/// Scales grads so their global L2 norm is at most max_norm; returns the norm before clipping.
double clip_grad_norm(std::span<float> grads, float max_norm);

}  // namespace ringzero
