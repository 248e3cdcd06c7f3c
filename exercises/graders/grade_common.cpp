// Graders for the exercises in common/ (chapter 01): one process, no MPI collectives.
//
//   grade_common linear_backward   01.1  common/core/ops.cpp linear_backward, kernels::column_sum
//   grade_common cross_entropy     01.2  common/core/ops.cpp cross_entropy_forward / _backward,
//                                        kernels::softmax_cross_entropy_row, cross_entropy_grad
//                                        (common/core/kernels.hpp: the GPU runs these)
//   grade_common adamw             01.3  common/core/optim.cpp AdamW::step
//
// Each compares the library function with a reference written here in float64 from the
// formula (PyTorch's documented semantics), element by element. Tolerances: float32 results
// of short sums (<= 8 terms) against float64: 1e-5 relative + 1e-6 absolute, about 100 float32
// ulps, far below any real mistake (a missing term or a wrong sign moves values by > 1e-2).
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "common/core/kernels.hpp"
#include "common/core/ops.hpp"
#include "common/core/optim.hpp"
#include "exercises/graders/grade.hpp"

using namespace ringzero;

namespace {

constexpr double kAtol = 1e-6, kRtol = 1e-5;

std::vector<float> values(int64_t n, float scale, float shift) {
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[i] = scale * std::sin(0.7f * static_cast<float>(i) + shift);
  return v;
}

Tensor tensor_of(std::vector<float>& storage, Shape shape) {
  return Tensor(storage.data(), std::move(shape));
}

std::string at2(const char* name, int64_t i, int64_t j) {
  return std::string(name) + "[" + std::to_string(i) + ", " + std::to_string(j) + "]";
}

// out = inp · weightᵀ + bias; dinp = dout · weight, dweight = doutᵀ · inp, dbias = Σ_b dout.
int linear_backward_grader() {
  grade::Report report("01.1 linear backward");
  const int64_t B = 3, C = 5, OC = 4;
  auto inp = values(B * C, 1.0f, 0.1f), weight = values(OC * C, 0.5f, 0.3f);
  auto dout = values(B * OC, 2.0f, 0.7f);
  // The d-buffers start non-zero: backward must ACCUMULATE (+=), as autograd.hpp requires.
  auto dinp = values(B * C, 0.25f, 1.1f), dweight = values(OC * C, 0.25f, 1.3f);
  auto dbias = values(OC, 0.25f, 1.7f);
  const auto dinp0 = dinp, dweight0 = dweight, dbias0 = dbias;
  linear_backward(tensor_of(dinp, {B, C}), tensor_of(dweight, {OC, C}), tensor_of(dbias, {OC}),
                  tensor_of(dout, {B, OC}), tensor_of(inp, {B, C}), tensor_of(weight, {OC, C}));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t c = 0; c < C; ++c) {
      double s = dinp0[b * C + c];
      for (int64_t o = 0; o < OC; ++o) s += double(dout[b * OC + o]) * weight[o * C + c];
      report.close(at2("dinp", b, c), s, dinp[b * C + c], kAtol, kRtol,
                   "dinp += dout (B, OC) · weight (OC, C), added to what dinp held");
    }
  for (int64_t o = 0; o < OC; ++o)
    for (int64_t c = 0; c < C; ++c) {
      double s = dweight0[o * C + c];
      for (int64_t b = 0; b < B; ++b) s += double(dout[b * OC + o]) * inp[b * C + c];
      report.close(at2("dweight", o, c), s, dweight[o * C + c], kAtol, kRtol,
                   "dweight += doutᵀ (OC, B) · inp (B, C), added to what dweight held");
    }
  for (int64_t o = 0; o < OC; ++o) {
    double s = dbias0[o];
    for (int64_t b = 0; b < B; ++b) s += dout[b * OC + o];
    report.close("dbias[" + std::to_string(o) + "]", s, dbias[o], kAtol, kRtol,
                 "dbias += column sums of dout over the batch");
  }
  // The first layer has no input gradient: an undefined dinp must be skipped, not written.
  auto dweight2 = std::vector<float>(OC * C, 0.0f), dbias2 = std::vector<float>(OC, 0.0f);
  linear_backward(Tensor(), tensor_of(dweight2, {OC, C}), tensor_of(dbias2, {OC}),
                  tensor_of(dout, {B, OC}), tensor_of(inp, {B, C}), tensor_of(weight, {OC, C}));
  for (int64_t o = 0; o < OC; ++o) {
    double s = 0;
    for (int64_t b = 0; b < B; ++b) s += dout[b * OC + o];
    report.close("dbias[" + std::to_string(o) + "] with dinp undefined", s, dbias2[o], kAtol, kRtol,
                 "an undefined dinp (first layer) changes nothing else");
  }
  // kernels::column_sum, the GPU's bias gradient (common/device/gpu/kernels.cu): the same sums.
  for (int64_t o = 0; o < OC; ++o) {
    double s = 0;
    for (int64_t b = 0; b < B; ++b) s += dout[b * OC + o];
    report.close("kernels::column_sum(dout, B, OC, " + std::to_string(o) + ")", s,
                 kernels::column_sum(dout.data(), B, OC, o), kAtol, kRtol,
                 "column j's sum over the B rows of the row-major (B, OC) dout");
  }
  return report.finish();
}

// loss = mean_b(logsumexp(z_b) - z_b[y_b]); probs = softmax(z); dz = dloss/B (probs - onehot).
int cross_entropy_grader() {
  grade::Report report("01.2 cross-entropy from logits");
  const int64_t B = 4, C = 6;
  auto logits = values(B * C, 3.0f, 0.2f);
  // Row 2 has logits near 1000: exp(1000) overflows float and double; the max-subtraction
  // (log-sum-exp trick) must keep the loss finite and exact.
  for (int64_t c = 0; c < C; ++c) logits[2 * C + c] += 1000.0f;
  // Row 3 has logits near -1000: exp underflows to 0 without the trick, log(0) = -inf.
  for (int64_t c = 0; c < C; ++c) logits[3 * C + c] -= 1000.0f;
  std::vector<int32_t> labels = {0, 3, 5, 2};
  std::vector<float> probs(B * C, 0.0f);
  const float loss =
      cross_entropy_forward(tensor_of(probs, {B, C}), tensor_of(logits, {B, C}), labels);
  double expected_loss = 0;
  std::vector<double> p(B * C);
  for (int64_t b = 0; b < B; ++b) {
    double zmax = -1e300;
    for (int64_t c = 0; c < C; ++c) zmax = std::max(zmax, double(logits[b * C + c]));
    double sum = 0;
    for (int64_t c = 0; c < C; ++c) sum += std::exp(double(logits[b * C + c]) - zmax);
    for (int64_t c = 0; c < C; ++c) p[b * C + c] = std::exp(double(logits[b * C + c]) - zmax) / sum;
    expected_loss += std::log(sum) + zmax - logits[b * C + labels[b]];
    double row = 0;
    for (int64_t c = 0; c < C; ++c) row += probs[b * C + c];
    report.close("sum of probs row " + std::to_string(b), 1.0, row, 1e-5, 0,
                 "each row of probs is a softmax: sums to 1 (rows 2 and 3: logits near ±1000)");
  }
  expected_loss /= B;
  report.close("loss", expected_loss, loss, kAtol, kRtol,
               "loss = mean over rows of logsumexp(z) - z[label], finite for logits near ±1000");
  for (int64_t b = 0; b < B; ++b)
    for (int64_t c = 0; c < C; ++c)
      report.close(at2("probs", b, c), p[b * C + c], probs[b * C + c], kAtol, kRtol,
                   "probs = softmax(logits) row by row (the backward reuses them)");
  // Backward from the grader's own probabilities, so a forward mistake is not counted twice.
  std::vector<float> pf(p.begin(), p.end());
  auto dlogits = values(B * C, 0.5f, 0.9f);
  const auto dlogits0 = dlogits;
  const float dloss = 0.5f;  // as if the loss were scaled by 1/K with K = 2
  cross_entropy_backward(tensor_of(dlogits, {B, C}), dloss, tensor_of(pf, {B, C}), labels);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t c = 0; c < C; ++c) {
      const double g = dloss / B * (p[b * C + c] - (c == labels[b] ? 1.0 : 0.0));
      report.close(at2("dlogits", b, c), dlogits0[b * C + c] + g, dlogits[b * C + c], kAtol, kRtol,
                   "dlogits += dloss / B · (probs - onehot(label)), accumulated");
    }
  // The GPU's per-row and per-element functions (common/core/kernels.hpp), on the same rows.
  std::vector<float> row_probs(C);
  for (int64_t b = 0; b < B; ++b) {
    double expected = 0, zmax = -1e300, sum = 0;
    for (int64_t c = 0; c < C; ++c) zmax = std::max(zmax, double(logits[b * C + c]));
    for (int64_t c = 0; c < C; ++c) sum += std::exp(double(logits[b * C + c]) - zmax);
    expected = std::log(sum) + zmax - logits[b * C + labels[b]];
    const double got =
        kernels::softmax_cross_entropy_row(logits.data() + b * C, row_probs.data(), C, labels[b]);
    report.close("kernels::softmax_cross_entropy_row, row " + std::to_string(b), expected, got,
                 kAtol, kRtol, "returns logsumexp(z) - z[label] of one row, finite at ±1000");
    for (int64_t c = 0; c < C; ++c)
      report.close("kernels::softmax_cross_entropy_row probs " + at2("p", b, c), p[b * C + c],
                   row_probs[c], kAtol, kRtol, "writes softmax(z) of the row into p");
    for (int64_t c = 0; c < C; ++c)
      report.close("kernels::cross_entropy_grad " + at2("dlogits", b, c),
                   dloss / B * (p[b * C + c] - (c == labels[b] ? 1.0 : 0.0)),
                   kernels::cross_entropy_grad(pf[b * C + c], c == labels[b], dloss / B), kAtol,
                   kRtol, "scale · (p - onehot), scale = dloss / B");
  }
  return report.finish();
}

// torch.optim.AdamW (single-tensor): per segment t += 1; p *= 1 - lr wd; m, v moments;
// p -= lr / (1 - b1^t) · m / (sqrt(v) / sqrt(1 - b2^t) + eps).
int adamw_grader() {
  grade::Report report("01.3 AdamW step");
  AdamWOptions o;
  o.lr = 1e-2f;
  o.weight_decay = 0.1f;
  const std::vector<int64_t> sizes = {5, 3};  // two parameters, each with its own step count
  AdamW optimizer(sizes, o);
  auto params = values(8, 1.0f, 0.4f);
  std::vector<double> p(params.begin(), params.end()), m(8, 0.0), v(8, 0.0);
  for (int step = 1; step <= 3; ++step) {
    auto grads = values(8, 0.1f * step, 0.3f * step);
    optimizer.step(params, grads);
    for (int64_t i = 0; i < 8; ++i) {
      const double g = grads[i], b1 = o.beta1, b2 = o.beta2;
      p[i] *= 1.0 - double(o.lr) * o.weight_decay;
      m[i] = b1 * m[i] + (1 - b1) * g;
      v[i] = b2 * v[i] + (1 - b2) * g * g;
      const double bc1 = 1 - std::pow(b1, step), bc2 = 1 - std::pow(b2, step);
      p[i] -= o.lr / bc1 * m[i] / (std::sqrt(v[i]) / std::sqrt(bc2) + o.eps);
      const std::string where = "step " + std::to_string(step) + ", element " + std::to_string(i);
      report.close(where + " param", p[i], params[i], kAtol, kRtol,
                   "decoupled weight decay, then the bias-corrected Adam update");
      report.close(where + " exp_avg", m[i], optimizer.exp_avg()[i], kAtol, kRtol,
                   "exp_avg = beta1 exp_avg + (1 - beta1) g");
      report.close(where + " exp_avg_sq", v[i], optimizer.exp_avg_sq()[i], 1e-9, kRtol,
                   "exp_avg_sq = beta2 exp_avg_sq + (1 - beta2) g²");
    }
  }
  for (size_t s = 0; s < sizes.size(); ++s)
    if (optimizer.segment_steps()[s] != 3)
      report.fail("segment " + std::to_string(s) + " step count: expected 3, got " +
                  std::to_string(optimizer.segment_steps()[s]) +
                  " — every segment counts its own steps (bias correction uses them)");
  return report.finish();
}

}  // namespace

int main(int argc, char** argv) {
  const std::string which = argc > 1 ? argv[1] : "";
  return grade::run_grader([&] {
    if (which == "linear_backward") return linear_backward_grader();
    if (which == "cross_entropy") return cross_entropy_grader();
    if (which == "adamw") return adamw_grader();
    RZ_CHECK(false, "grade_common: unknown check '"
                        << which << "'; use linear_backward, cross_entropy or adamw");
    return 2;
  });
}
