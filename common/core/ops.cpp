#include "common/core/ops.hpp"

#include <algorithm>
#include <cmath>
#include <vector>

#include "common/core/check.hpp"
#include "common/core/device_backend.hpp"
#include "common/core/half.hpp"
#include "common/core/kernels.hpp"

namespace ringzero {

void linear_forward(Tensor out, const Tensor& inp, const Tensor& weight, const Tensor& bias) {
  RZ_CHECK(inp.cols() == weight.cols() && out.cols() == weight.rows() && out.rows() == inp.rows(),
           "linear: inp " << shape_str(inp.shape()) << ", weight " << shape_str(weight.shape())
                          << ", out " << shape_str(out.shape())
                          << " do not fit (B, C) x (OC, C)ᵀ -> (B, OC)");
  if (DeviceBackend* d = backend_of({out.data(), inp.data(), weight.data(), bias.data()}))
    return d->linear_forward(out, inp, weight, bias);
  out.mat().noalias() = inp.mat() * weight.mat().transpose();
  const int64_t B = out.rows(), OC = out.cols();
  float* o = out.data();
  const float* b = bias.data();
  for (int64_t i = 0; i < B; ++i)
    for (int64_t j = 0; j < OC; ++j) o[i * OC + j] += b[j];  // bias add, kernels.cu's too
}

void linear_backward(Tensor dinp, Tensor dweight, Tensor dbias, const Tensor& dout,
                     const Tensor& inp, const Tensor& weight) {
  if (DeviceBackend* d = backend_of({dinp.data(), dweight.data(), dbias.data(), dout.data(),
                                     inp.data(), weight.data()}))
    return d->linear_backward(dinp, dweight, dbias, dout, inp, weight);
  // BEGIN EXERCISE 01.1 (linear backward)
  if (dinp.defined()) dinp.mat().noalias() += dout.mat() * weight.mat();  // (B, OC)(OC, C)
  dweight.mat().noalias() += dout.mat().transpose() * inp.mat();          // (OC, B)(B, C)
  // Column sums in row order, by hand: Eigen's colwise().sum() sums the columns it vectorises
  // in another order than those it peels to reach an aligned address, so the bits depended on
  // where dbias lives, and the ZeRO layouts (padding, gathered buffers) move it.
  const int64_t B = dout.rows(), OC = dout.cols();
  const float* d = dout.data();
  for (int64_t j = 0; j < OC; ++j) {
    float s = 0.0f;
    for (int64_t b = 0; b < B; ++b) s += d[b * OC + j];
    dbias[j] += s;
  }
  // END EXERCISE 01.1
}

void relu_forward(Tensor out, const Tensor& inp) {
  if (DeviceBackend* d = backend_of({out.data(), inp.data()})) return d->relu_forward(out, inp);
  float* o = out.data();
  const float* x = inp.data();
  for (int64_t i = 0, n = inp.numel(); i < n; ++i) o[i] = kernels::relu(x[i]);
}

void relu_backward(Tensor dinp, const Tensor& dout, const Tensor& out) {
  if (DeviceBackend* d = backend_of({dinp.data(), dout.data(), out.data()}))
    return d->relu_backward(dinp, dout, out);
  float* dx = dinp.data();
  const float *dy = dout.data(), *y = out.data();
  for (int64_t i = 0, n = out.numel(); i < n; ++i) dx[i] += kernels::relu_grad(dy[i], y[i]);
}

float mse_forward(const Tensor& pred, const Tensor& target) {
  RZ_CHECK(pred.shape() == target.shape(),
           "mse: pred " << shape_str(pred.shape()) << " vs target " << shape_str(target.shape()));
  if (DeviceBackend* d = backend_of({pred.data(), target.data()}))
    return d->mse_forward(pred, target);
  double sum = 0.0;
  for (int64_t i = 0; i < pred.numel(); ++i) sum += kernels::squared_error(pred[i], target[i]);
  return static_cast<float>(sum / static_cast<double>(pred.numel()));
}

void mse_backward(Tensor dpred, float dloss, const Tensor& pred, const Tensor& target) {
  if (DeviceBackend* d = backend_of({dpred.data(), pred.data(), target.data()}))
    return d->mse_backward(dpred, dloss, pred, target);
  const float scale = 2.0f * dloss / static_cast<float>(pred.numel());
  float* d = dpred.data();
  const float *p = pred.data(), *t = target.data();
  for (int64_t i = 0, n = pred.numel(); i < n; ++i) d[i] += kernels::mse_grad(p[i], t[i], scale);
}

float cross_entropy_forward(Tensor probs, const Tensor& logits, std::span<const int32_t> labels) {
  const int64_t B = logits.rows(), C = logits.cols();
  RZ_CHECK(static_cast<int64_t>(labels.size()) == B,
           "cross_entropy: " << labels.size() << " labels for " << B << " rows");
  if (DeviceBackend* d = backend_of({probs.data(), logits.data()}))
    return d->cross_entropy_forward(probs, logits, labels);
  double nll = 0.0;
  for (int64_t b = 0; b < B; ++b) {
    RZ_CHECK(labels[b] >= 0 && labels[b] < C,
             "cross_entropy: label " << labels[b] << " outside [0, " << C << ")");
    const float* z = logits.data() + b * C;
    float* p = probs.data() + b * C;
    // BEGIN EXERCISE 01.2 (cross-entropy from logits: forward)
    // log-softmax with the max subtracted: exp never overflows, the largest term is exp(0) = 1.
    const float zmax = *std::max_element(z, z + C);
    double sum = 0.0;
    for (int64_t c = 0; c < C; ++c) sum += std::exp(static_cast<double>(z[c] - zmax));
    const double log_sum = std::log(sum);
    for (int64_t c = 0; c < C; ++c) p[c] = static_cast<float>(std::exp(z[c] - zmax - log_sum));
    nll += log_sum - (z[labels[b]] - zmax);
    // END EXERCISE 01.2
  }
  return static_cast<float>(nll / static_cast<double>(B));
}

void cross_entropy_backward(Tensor dlogits, float dloss, const Tensor& probs,
                            std::span<const int32_t> labels) {
  if (DeviceBackend* d = backend_of({dlogits.data(), probs.data()}))
    return d->cross_entropy_backward(dlogits, dloss, probs, labels);
  // BEGIN EXERCISE 01.2 (cross-entropy from logits: backward)
  const int64_t B = probs.rows(), C = probs.cols();
  const float scale = dloss / static_cast<float>(B);
  for (int64_t b = 0; b < B; ++b) {
    float* d = dlogits.data() + b * C;
    const float* p = probs.data() + b * C;
    for (int64_t c = 0; c < C; ++c)
      d[c] += kernels::cross_entropy_grad(p[c], c == labels[b], scale);
  }
  // END EXERCISE 01.2
}

Var linear(Tape& tape, const Var& inp, Parameter& weight, Parameter& bias) {
  auto out =
      make_var(Tensor::zeros({inp->value.rows(), weight.shape()[0]}, MemTag::activations,
                             inp->value.device()),
               true);
  linear_forward(out->value, inp->value, weight.data, bias.data);
  tape.record(
      [out, inp, &weight, &bias] {
        Tensor dinp = inp->requires_grad ? inp->grad_buffer() : Tensor();
        linear_backward(dinp, weight.grad, bias.grad, out->grad_buffer(), inp->value, weight.data);
      },
      {&weight, &bias});
  return out;
}

Var relu(Tape& tape, const Var& inp) {
  auto out = make_var(
      Tensor::zeros(inp->value.shape(), MemTag::activations, inp->value.device()),
      inp->requires_grad);
  relu_forward(out->value, inp->value);
  if (inp->requires_grad) {
    tape.record([out, inp] { relu_backward(inp->grad_buffer(), out->grad_buffer(), out->value); });
  }
  return out;
}

Var mse_loss(Tape& tape, const Var& pred, const Tensor& target) {
  auto loss = make_var(Tensor::zeros({1}, MemTag::activations), pred->requires_grad);
  loss->value[0] = mse_forward(pred->value, target);
  tape.record([loss, pred, target] {
    mse_backward(pred->grad_buffer(), loss->grad_buffer()[0], pred->value, target);
  });
  return loss;
}

Var cross_entropy(Tape& tape, const Var& logits, std::span<const int32_t> labels) {
  auto loss = make_var(Tensor::zeros({1}, MemTag::activations), logits->requires_grad);
  Tensor probs =
      Tensor::zeros(logits->value.shape(), MemTag::activations, logits->value.device());
  loss->value[0] = cross_entropy_forward(probs, logits->value, labels);
  tape.record([loss, logits, probs, labels = std::vector<int32_t>(labels.begin(), labels.end())] {
    cross_entropy_backward(logits->grad_buffer(), loss->grad_buffer()[0], probs, labels);
  });
  return loss;
}

// A copy of t rounded to dtype's 16-bit values (still float32), where t lives, for linear_half.
static Tensor rounded_copy(const Tensor& t, Dtype dtype) {
  Tensor c = Tensor::zeros(t.shape(), MemTag::activations, t.device());
  copy_elements(std::span<const float>(t.data(), static_cast<size_t>(t.numel())), c.span());
  round_in_place(dtype, c.span());
  return c;
}

Var linear_half(Tape& tape, const Var& inp, Parameter& weight, Parameter& bias, Dtype dtype) {
  RZ_CHECK(dtype != Dtype::fp32, "linear_half: dtype fp32; use linear()");
  const Device device = inp->value.device();
  Tensor x16 = rounded_copy(inp->value, dtype);
  auto out = make_var(
      Tensor::zeros({inp->value.rows(), weight.shape()[0]}, MemTag::activations, device), true);
  linear_forward(out->value, x16, weight.data, bias.data);  // 16-bit values, fp32 accumulation
  round_in_place(dtype, out->value.span());
  tape.record(
      [out, inp, x16, &weight, &bias, dtype, device] {
        Tensor dout16 = rounded_copy(out->grad_buffer(), dtype);
        Tensor dinp;
        if (inp->requires_grad) dinp = Tensor::zeros(inp->value.shape(), MemTag::activations, device);
        linear_backward(dinp, weight.grad, bias.grad, dout16, x16, weight.data);
        if (inp->requires_grad) {
          round_in_place(dtype, dinp.span());
          add_into(inp->grad_buffer().span(), dinp.span());
        }
      },
      {&weight, &bias});
  return out;
}

}  // namespace ringzero
