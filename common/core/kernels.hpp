// kernels: the element math of every op and optimizer, written once for the CPU and the GPU.
//
// Provides: the per-element (or per-row, per-column) functions that
// common/core/ops.cpp and common/core/optim.cpp loop over on the CPU and
// common/device/gpu/kernels.cu launches one thread per element (row, column) on the GPU. So the CPU
// unit tests exercise the very arithmetic the GPU runs; only the loop around it differs (llm.c
// keeps the same split between its CPU reference train_gpt2.c and its CUDA kernels, written twice;
// here it is written once).
//
// What can still differ between the two: (1) reductions (sum of squares, MSE's sum) that the GPU
// cuts into per-block partials and so adds in another order; (2) fused multiply-adds, which GCC
// (-march=native) and nvcc each contract on their own; (3) exp/log in double, where CUDA's and
// glibc's results may differ in the last bit. tests/tools/gpu_kernels_check.cpp measures all three.
// RZ_HD (__host__ __device__ under nvcc) and the bf16/fp16 conversions, the GPU's too, are
// common/core/half_kernels.hpp's. Leaves out: matrix products (Eigen on the CPU, cuBLAS on the GPU).
#pragma once

#include <cmath>
#include <cstdint>

#include "common/core/check.hpp"  // exercise_stub, for the starter stubs of exercises 01.1-01.3
#include "common/core/half_kernels.hpp"  // RZ_HD

namespace ringzero::kernels {

/// ReLU, as std::max(x, 0.0f) and Eigen's cwiseMax(0): -0.0 and NaN pass through unchanged.
RZ_HD inline float relu(float x) {
  return x < 0.0f ? 0.0f : x;
}

/// ReLU's backward from the forward's output: dout where out > 0, else 0 (PyTorch: 0 at x = 0).
RZ_HD inline float relu_grad(float dout, float out) {
  return out > 0.0f ? dout : 0.0f;
}

/// Σ_b dout[b, j] over the B rows of a row-major (B, OC) array, in row order (the bias
/// gradient of column j). The same order on both devices, so the same float bits.
RZ_HD inline float column_sum(const float* dout, int64_t B, int64_t OC, int64_t j) {
  // BEGIN EXERCISE 01.1 (linear backward: the bias gradient's column sum, the GPU's too)
  float s = 0.0f;
  for (int64_t b = 0; b < B; ++b) s += dout[b * OC + j];
  return s;
  // END EXERCISE 01.1
}

/// One row of softmax cross-entropy (nn.CrossEntropyLoss, before the batch mean): writes
/// softmax(z) into p[0, C) and returns logsumexp(z) - z[label] in float64. The max is subtracted
/// first, so exp never overflows; sums run in float64 as in the CPU reference. label must lie in
/// [0, C) (the callers check it).
RZ_HD inline double softmax_cross_entropy_row(const float* z, float* p, int64_t C, int32_t label) {
  // BEGIN EXERCISE 01.2 (cross-entropy from logits: one row, the GPU's)
  float zmax = z[0];
  for (int64_t c = 1; c < C; ++c) zmax = z[c] > zmax ? z[c] : zmax;
  double sum = 0.0;
  for (int64_t c = 0; c < C; ++c) sum += std::exp(static_cast<double>(z[c] - zmax));
  const double log_sum = std::log(sum);
  for (int64_t c = 0; c < C; ++c) p[c] = static_cast<float>(std::exp(z[c] - zmax - log_sum));
  return log_sum - (z[label] - zmax);
  // END EXERCISE 01.2
}

/// d logits of cross-entropy: scale * (p - onehot), scale = dloss / B.
RZ_HD inline float cross_entropy_grad(float p, bool is_label, float scale) {
  // BEGIN EXERCISE 01.2 (cross-entropy from logits: one element of the backward)
  return scale * (p - (is_label ? 1.0f : 0.0f));
  // END EXERCISE 01.2
}

/// (pred - target)² in float64, one term of MSE's sum.
RZ_HD inline double squared_error(float pred, float target) {
  const double d = static_cast<double>(pred) - target;
  return d * d;
}

/// d pred of MSE (reduction "mean"): scale * (pred - target), scale = 2 dloss / numel.
RZ_HD inline float mse_grad(float pred, float target, float scale) {
  return scale * (pred - target);
}

/// g² in float64, one term of the global gradient norm (clip_grad_norm_).
RZ_HD inline double square(float g) {
  return static_cast<double>(g) * g;
}

/// The per-step constants of one AdamW segment (computed on the host, in float64 where
/// torch computes in Python floats; see AdamW::step).
struct AdamWStep {
  float decay;  ///< 1 - lr * weight_decay
  float beta1, beta2, eps;
  float step_size;              ///< lr / (1 - beta1^t)
  float bias_correction2_sqrt;  ///< sqrt(1 - beta2^t)
};

/// One AdamW element update (torch.optim.AdamW, single-tensor path, Loshchilov & Hutter 2019
/// Algorithm 2 with PyTorch's placement of eps):
///   p *= decay;  m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g²;
///   p -= step_size * m / (sqrt(v) / sqrt(1 - b2^t) + eps).
/// The one statement of the formula: AdamW::step (CPU) and the GPU's adamw_kernel both call it.
RZ_HD inline void adamw_update(float& p, float& m, float& v, float g, const AdamWStep& k) {
  // BEGIN EXERCISE 01.3 (AdamW step: one element)
  p *= k.decay;
  m = m * k.beta1 + (1.0f - k.beta1) * g;
  v = v * k.beta2 + (1.0f - k.beta2) * g * g;
  const float denom = std::sqrt(v) / k.bias_correction2_sqrt + k.eps;
  p -= k.step_size * (m / denom);
  // END EXERCISE 01.3
}

/// One SGD element update (torch.optim.SGD, dampening 0, no nesterov): d = g + wd p; with
/// momentum, buf = d on the first step else momentum buf + d, and d = buf; p -= lr d.
/// buf is ignored when momentum == 0.
RZ_HD inline void sgd_update(float& p, float& buf, float g, float lr, float momentum,
                             float weight_decay, bool first_step) {
  float d = g + weight_decay * p;
  if (momentum > 0) {
    buf = first_step ? d : momentum * buf + d;
    d = buf;
  }
  p -= lr * d;
}

}  // namespace ringzero::kernels
