// ops: the forward/backward kernels of the models, and their autograd wrappers.
//
// Provides, llm.c style, each backward beside its forward with mirrored arguments
// (outputs first, then inputs, then parameters); backward ACCUMULATES into every d-buffer:
//   linear   out = inp · weightᵀ + bias                      (torch.nn.functional.linear)
//   relu     out = max(inp, 0)
//   mse      loss = mean((pred - target)²) over all elements  (nn.MSELoss, reduction="mean")
//   cross_entropy  loss = mean_b( logsumexp(logits_b) - logits_b[label_b] )  (nn.CrossEntropyLoss)
// The wrappers (linear, relu, mse_loss, cross_entropy) run the forward and record the backward.
// Each function runs on the host or, when its tensors live on a device, on that device's
// backend (the one backend_of line ahead of each loop, common/core/device_backend.hpp). Outputs are
// allocated where the inputs live; a loss is a host scalar (its forward returns it, as .item()).
// Leaves out: every op the two models do not need.
#pragma once

#include <cstdint>
#include <span>

#include "common/core/autograd.hpp"
#include "common/core/half.hpp"

namespace ringzero {

// inp (B, C), weight (OC, C), bias (OC) -> out (B, OC)
void linear_forward(Tensor out, const Tensor& inp, const Tensor& weight, const Tensor& bias);
// dout (B, OC) -> dinp (B, C) if defined, dweight (OC, C), dbias (OC); all +=
void linear_backward(Tensor dinp, Tensor dweight, Tensor dbias, const Tensor& dout,
                     const Tensor& inp, const Tensor& weight);

void relu_forward(Tensor out, const Tensor& inp);
// Uses the forward's output: d/dx relu(x) = [out > 0] (0 at x = 0, as PyTorch).
void relu_backward(Tensor dinp, const Tensor& dout, const Tensor& out);

// pred, target (B, D) -> mean squared error (float64 accumulation, returned as float)
float mse_forward(const Tensor& pred, const Tensor& target);
void mse_backward(Tensor dpred, float dloss, const Tensor& pred, const Tensor& target);

// logits (B, C), labels B values in [0, C) -> mean negative log-likelihood; probs (B, C) gets
// the softmax, which the backward reuses. Errors: a label outside [0, C).
float cross_entropy_forward(Tensor probs, const Tensor& logits, std::span<const int32_t> labels);
void cross_entropy_backward(Tensor dlogits, float dloss, const Tensor& probs,
                            std::span<const int32_t> labels);

// Autograd wrappers. Parameters are read through the Parameter at the moment each
// forward/backward runs (invariant 3 of autograd.hpp).
Var linear(Tape& tape, const Var& inp, Parameter& weight, Parameter& bias);
Var relu(Tape& tape, const Var& inp);
Var mse_loss(Tape& tape, const Var& pred, const Tensor& target);
Var cross_entropy(Tape& tape, const Var& logits, std::span<const int32_t> labels);

/// The Linear op of a 16-bit model (torch.autocast's linear; Linear::forward calls it when its
/// compute_dtype is bf16 or fp16). inp (B, C), weight (OC, C), bias (OC), whose data must
/// already hold 16-bit values (HalfStorage's hooks see to that, common/precision/mixed.hpp)
/// -> (B, OC): inputs rounded to 16 bits, the product accumulated in fp32, the output rounded.
/// Backward: dout rounded; dweight, dbias += fp32-accumulated products (HalfStorage rounds
/// them into the 16-bit gradient); dinp += the rounded input gradient. Errors: dtype fp32.
Var linear_half(Tape& tape, const Var& inp, Parameter& weight, Parameter& bias, Dtype dtype);

}  // namespace ringzero
