// Ops: a hand-computable forward (and backward) value per op, and every op's gradient against
// central differences, first kernel by kernel, then through the tape on a small model.
//
// Gradient checks use an objective J in double: J = Σ dout ⊙ out for the ops with a tensor
// output (so dJ/dinput is exactly what backward computes from dout) and the loss itself for
// the two losses. Errors of a central difference with step h: truncation h²/6 |J'''| plus
// rounding ≈ ε32 |J| / h (the forward runs in float32, ε32 ≈ 6e-8). Steps and tolerances are
// given per op next to that budget; the measured worst errors are noted there.
#include <catch2/catch.hpp>

#include <cmath>
#include <vector>

#include "common/core/nn.hpp"
#include "common/core/ops.hpp"
#include "util.hpp"

using namespace ringzero;
using namespace ringzero::test;
using Catch::Matchers::Contains;

namespace {

// Σ a ⊙ b in double.
double dot(const Tensor& a, const Tensor& b) {
  double s = 0;
  for (int64_t i = 0; i < a.numel(); ++i) s += static_cast<double>(a[i]) * b[i];
  return s;
}

// Compares backward's gradient `analytic` of every element of `x` with central differences
// of J; |numeric - analytic| <= atol + rtol |analytic|. Returns the worst absolute error.
double check_gradient(const std::function<double()>& J, Tensor x, const Tensor& analytic, float h,
                      double atol, double rtol) {
  double worst = 0;
  for (int64_t i = 0; i < x.numel(); ++i) {
    const double numeric = central_difference(J, x[i], h);
    const double err = std::fabs(numeric - analytic[i]);
    worst = std::max(worst, err);
    INFO("element " << i << ": numeric " << numeric << ", analytic " << analytic[i]);
    REQUIRE(err <= atol + rtol * std::fabs(analytic[i]));
  }
  return worst;
}

}  // namespace

TEST_CASE("linear forward and backward by hand", "[ops]") {
  Tensor inp = tensor({2, 2}, {1, 2, 3, 4});
  Tensor weight = tensor({3, 2}, {1, 0, 0.5f, -1, 2, 1});
  Tensor bias = tensor({3}, {0.5f, 1, -1});
  Tensor out = Tensor::zeros({2, 3}, MemTag::activations);
  linear_forward(out, inp, weight, bias);
  // out = inp weightᵀ + bias: [1+0.5, 0.5-2+1, 2+2-1], [3+0.5, 1.5-4+1, 6+4-1]
  const std::vector<float> expected{1.5f, -0.5f, 3, 3.5f, -1.5f, 9};
  for (int i = 0; i < 6; ++i) REQUIRE(out[i] == expected[i]);

  // dout = ones: dinp = dout weight = column sums of weight; dweight = doutᵀ inp = column
  // sums of inp in every row; dbias = B. Buffers start at 1 to check the += contract.
  Tensor dout = tensor({2, 3}, {1, 1, 1, 1, 1, 1});
  Tensor dinp = tensor({2, 2}, {1, 1, 1, 1});
  Tensor dweight = tensor({3, 2}, {1, 1, 1, 1, 1, 1});
  Tensor dbias = tensor({3}, {1, 1, 1});
  linear_backward(dinp, dweight, dbias, dout, inp, weight);
  for (int i = 0; i < 2; ++i) {
    REQUIRE(dinp[2 * i] == 1 + 3.5f);
    REQUIRE(dinp[2 * i + 1] == 1 + 0.0f);
  }
  for (int o = 0; o < 3; ++o) {
    REQUIRE(dweight[2 * o] == 1 + 4.0f);
    REQUIRE(dweight[2 * o + 1] == 1 + 6.0f);
    REQUIRE(dbias[o] == 1 + 2.0f);
  }
  // An undefined dinp (the input needs no gradient) is skipped.
  linear_backward(Tensor(), dweight, dbias, dout, inp, weight);
  REQUIRE(dbias[0] == 5.0f);
}

TEST_CASE("linear rejects shapes that do not fit", "[ops]") {
  Tensor inp = Tensor::zeros({2, 3}, MemTag::activations);
  Tensor weight = Tensor::zeros({4, 2}, MemTag::activations);
  Tensor bias = Tensor::zeros({4}, MemTag::activations);
  Tensor out = Tensor::zeros({2, 4}, MemTag::activations);
  REQUIRE_THROWS_WITH(linear_forward(out, inp, weight, bias),
                      Contains("(2, 3)") && Contains("(4, 2)"));
}

TEST_CASE("relu forward and backward by hand", "[ops]") {
  Tensor inp = tensor({4}, {-1, 0, 2.5f, -0.0f});
  Tensor out = Tensor::zeros({4}, MemTag::activations);
  relu_forward(out, inp);
  REQUIRE(out[0] == 0.0f);
  REQUIRE(out[1] == 0.0f);
  REQUIRE(out[2] == 2.5f);
  REQUIRE(out[3] == 0.0f);
  Tensor dout = tensor({4}, {10, 20, 30, 40});
  Tensor dinp = tensor({4}, {1, 1, 1, 1});
  relu_backward(dinp, dout, out);
  // Gradient 0 at x = 0, as PyTorch's threshold_backward.
  REQUIRE(dinp[0] == 1.0f);
  REQUIRE(dinp[1] == 1.0f);
  REQUIRE(dinp[2] == 31.0f);
  REQUIRE(dinp[3] == 1.0f);
}

TEST_CASE("mse forward and backward by hand", "[ops]") {
  Tensor pred = tensor({2, 2}, {1, 2, 3, 4});
  Tensor target = tensor({2, 2}, {1, 0, 0, 0});
  REQUIRE(mse_forward(pred, target) == 7.25f);  // (0 + 4 + 9 + 16) / 4
  Tensor dpred = tensor({2, 2}, {1, 1, 1, 1});
  mse_backward(dpred, 1.0f, pred, target);  // += 2 (pred - target) / 4
  REQUIRE(dpred[0] == 1.0f);
  REQUIRE(dpred[1] == 2.0f);
  REQUIRE(dpred[2] == 2.5f);
  REQUIRE(dpred[3] == 3.0f);
  Tensor other = Tensor::zeros({4}, MemTag::activations);
  REQUIRE_THROWS_WITH(mse_forward(pred, other), Contains("(2, 2)") && Contains("(4)"));
}

TEST_CASE("cross_entropy forward and backward by hand", "[ops]") {
  // logits [0, ln 3]: softmax (1/4, 3/4); label 0 costs ln 4, label 1 costs ln(4/3).
  const float ln3 = std::log(3.0f);
  Tensor logits = tensor({2, 2}, {0, ln3, 0, ln3});
  Tensor probs = Tensor::zeros({2, 2}, MemTag::activations);
  const std::vector<int32_t> labels{0, 1};
  const float loss = cross_entropy_forward(probs, logits, labels);
  REQUIRE(loss == Approx((std::log(4.0) + std::log(4.0 / 3.0)) / 2).epsilon(1e-6));
  REQUIRE(probs[0] == Approx(0.25).epsilon(1e-6));
  REQUIRE(probs[1] == Approx(0.75).epsilon(1e-6));
  Tensor dlogits = Tensor::zeros({2, 2}, MemTag::activations);
  cross_entropy_backward(dlogits, 1.0f, probs, labels);  // (softmax - onehot) / B
  REQUIRE(dlogits[0] == Approx(-0.375).epsilon(1e-6));
  REQUIRE(dlogits[1] == Approx(0.375).epsilon(1e-6));
  REQUIRE(dlogits[2] == Approx(0.125).epsilon(1e-6));
  REQUIRE(dlogits[3] == Approx(-0.125).epsilon(1e-6));
}

TEST_CASE("cross_entropy is stable for huge logits and checks labels", "[ops]") {
  // A naive softmax overflows exp(1000) to inf; the log-sum-exp with the max subtracted gives
  // loss 1000 for the wrong class and exp(-1000) ≈ 0 for the right one.
  Tensor logits = tensor({2, 2}, {1000, 0, 1000, 0});
  Tensor probs = Tensor::zeros({2, 2}, MemTag::activations);
  const std::vector<int32_t> wrong{1, 1};
  REQUIRE(cross_entropy_forward(probs, logits, wrong) == 1000.0f);
  const std::vector<int32_t> right{0, 0};
  REQUIRE(cross_entropy_forward(probs, logits, right) == 0.0f);
  REQUIRE(probs[0] == 1.0f);
  REQUIRE(probs[1] == 0.0f);
  const std::vector<int32_t> bad{0, 2};
  REQUIRE_THROWS_WITH(cross_entropy_forward(probs, logits, bad),
                      Contains("label 2 outside [0, 2)"));
}

TEST_CASE("linear gradient matches central differences", "[ops][gradcheck]") {
  // J = Σ dout ⊙ (inp Wᵀ + b) is linear in every single input, so the central difference has
  // no truncation error and a large step h = 0.1 keeps the rounding term small:
  // ε32 |J| / 2h ≈ 6e-8 · 10 / 0.2 = 3e-6. Tolerance 1e-4 + 1e-4 |g| (measured: 2.2e-6).
  Tensor inp = randn({3, 4}, 1), weight = randn({5, 4}, 2), bias = randn({5}, 3),
         dout = randn({3, 5}, 4);
  Tensor out = Tensor::zeros({3, 5}, MemTag::activations);
  auto J = [&] {
    linear_forward(out, inp, weight, bias);
    return dot(dout, out);
  };
  Tensor dinp = Tensor::zeros({3, 4}, MemTag::activations),
         dweight = Tensor::zeros({5, 4}, MemTag::activations),
         dbias = Tensor::zeros({5}, MemTag::activations);
  linear_backward(dinp, dweight, dbias, dout, inp, weight);
  check_gradient(J, inp, dinp, 0.1f, 1e-4, 1e-4);
  check_gradient(J, weight, dweight, 0.1f, 1e-4, 1e-4);
  check_gradient(J, bias, dbias, 0.1f, 1e-4, 1e-4);
}

TEST_CASE("relu gradient matches central differences", "[ops][gradcheck]") {
  // Inputs are kept at least 0.1 away from the kink and h = 0.01, so every difference stays on
  // one linear piece: no truncation error. Tolerance 1e-4 (measured: 2e-14).
  Tensor inp = randn({3, 7}, 5), dout = randn({3, 7}, 6);
  for (float& v : inp.span()) v = v >= 0 ? v + 0.1f : v - 0.1f;
  Tensor out = Tensor::zeros({3, 7}, MemTag::activations);
  auto J = [&] {
    relu_forward(out, inp);
    return dot(dout, out);
  };
  relu_forward(out, inp);
  Tensor dinp = Tensor::zeros({3, 7}, MemTag::activations);
  relu_backward(dinp, dout, out);
  check_gradient(J, inp, dinp, 0.01f, 1e-4, 1e-4);
}

TEST_CASE("mse gradient matches central differences", "[ops][gradcheck]") {
  // The loss is quadratic, so the central difference is exact but for rounding: the loss
  // (≈ 2) comes back as float32, ε32 · 2 / 2h ≈ 6e-6 with h = 0.01; the gradients are ≈ 0.1.
  // Tolerance 3e-5 + 1e-3 |g| (measured: 2.9e-6).
  Tensor pred = randn({3, 5}, 7), target = randn({3, 5}, 8);
  auto J = [&] { return static_cast<double>(mse_forward(pred, target)); };
  Tensor dpred = Tensor::zeros({3, 5}, MemTag::activations);
  mse_backward(dpred, 1.0f, pred, target);
  check_gradient(J, pred, dpred, 0.01f, 3e-5, 1e-3);
}

TEST_CASE("cross_entropy gradient matches central differences", "[ops][gradcheck]") {
  // Truncation h²/6 |J'''| ≤ 1e-4/6 · 1/B with h = 0.01 and B = 4; rounding ε32 · 3 / 2h ≈ 1e-5
  // (loss ≈ 3, float32). Tolerance 3e-5 + 1e-3 |g| (measured: 8.8e-6); gradients are ≈ 0.05.
  Tensor logits = randn({4, 6}, 9);
  for (float& v : logits.span()) v *= 2;
  const std::vector<int32_t> labels{0, 5, 2, 2};
  Tensor probs = Tensor::zeros({4, 6}, MemTag::activations);
  auto J = [&] { return static_cast<double>(cross_entropy_forward(probs, logits, labels)); };
  cross_entropy_forward(probs, logits, labels);
  Tensor dlogits = Tensor::zeros({4, 6}, MemTag::activations);
  cross_entropy_backward(dlogits, 1.0f, probs, labels);
  check_gradient(J, logits, dlogits, 0.01f, 3e-5, 1e-3);
}

TEST_CASE("the tape's gradients of a model match central differences",
          "[ops][gradcheck][autograd]") {
  // Linear(6, 5) - ReLU - Linear(5, 4) with either loss, through the autograd wrappers and
  // Tape::backward. h = 1e-2; no pre-activation of this seed lies within h·|x| of the ReLU kink
  // (else one difference would straddle it). Budget as for the losses above; tolerance
  // 5e-5 + 2e-3 |g| (measured: 5.9e-6).
  const bool classification = GENERATE(false, true);
  Model model({6, 5, 4}, 11);
  Tensor x = randn({3, 6}, 12), y = randn({3, 4}, 13);
  const std::vector<int32_t> labels{3, 0, 1};
  auto loss_of = [&](Tape& tape) {
    Var out = model.forward(tape, make_var(x));
    return classification ? cross_entropy(tape, out, labels) : mse_loss(tape, out, y);
  };
  auto J = [&] {
    Tape tape;
    return static_cast<double>(loss_of(tape)->value[0]);
  };
  model.zero_grad();
  Tape tape;
  tape.backward(loss_of(tape));
  for (Parameter* p : model.parameters()) {
    INFO("parameter " << p->name() << (classification ? " (cross-entropy)" : " (mse)"));
    check_gradient(J, p->data, p->grad, 1e-2f, 5e-5, 2e-3);
  }
}
