// Optimizers against hand-computed values: SGD (momentum, weight decay) and AdamW (decoupled
// weight decay, bias correction) over 3 steps, each expected value computed here in double
// from torch.optim's documented update rules, not by calling the code under test; and
// clip_grad_norm (torch.nn.utils.clip_grad_norm_).
// The reference takes the hyperparameters as the float32 values the options hold (0.999f is
// 0.99900001287...; torch keeps Python doubles, a 1.3e-5 relative difference in 1 - beta2 that
// only the golden test, tests/unit/golden_toy_test.cpp, sees). What is left is float32
// arithmetic: tolerance 1e-6 relative (measured 1.6e-7) + 1e-8 absolute per element: element 4
// goes from -0.1 to 0.001 in step 1, a cancellation of terms ≈ 0.1 whose float32 rounding
// (≈ 4e-9) is large relative to the result.
#include <catch2/catch.hpp>

#include <cmath>
#include <vector>

#include "common/core/optim.hpp"

using namespace ringzero;
using Catch::Matchers::Contains;

namespace {

// Gradients of the three steps: chosen, not computed, so the test needs no model.
const std::vector<std::vector<float>> kGrads{{0.5f, -1.0f, 2.0f, 1e-3f, -0.25f},
                                             {0.3f, -0.7f, -1.5f, 2e-3f, 0.0f},
                                             {-0.2f, 0.4f, 1.0f, -1e-3f, 0.75f}};
const std::vector<float> kInit{1.0f, -2.0f, 0.5f, 3.0f, -0.1f};

void require_close(std::span<const float> got, const std::vector<double>& expected) {
  REQUIRE(got.size() == expected.size());
  for (size_t i = 0; i < got.size(); ++i) {
    INFO("element " << i);
    REQUIRE(got[i] == Approx(expected[i]).epsilon(1e-6).margin(1e-8));
  }
}

}  // namespace

TEST_CASE("SGD with momentum and weight decay matches torch.optim.SGD by hand", "[optim]") {
  const double lr = 0.1f, momentum = 0.9f, wd = 0.01f;  // float32 values, as SGDOptions holds
  std::vector<float> p = kInit;
  SGD sgd(static_cast<int64_t>(p.size()), SGDOptions{0.1f, 0.9f, 0.01f});
  std::vector<double> ref(kInit.begin(), kInit.end()), buf(p.size());
  for (size_t t = 0; t < kGrads.size(); ++t) {
    sgd.step(p, kGrads[t]);
    for (size_t i = 0; i < p.size(); ++i) {
      const double d = kGrads[t][i] + wd * ref[i];  // L2 term added to the gradient
      buf[i] = t == 0 ? d : momentum * buf[i] + d;  // first step: buf = d (no dampening)
      ref[i] -= lr * buf[i];
    }
    INFO("after step " << t + 1);
    require_close(p, ref);
  }
}

TEST_CASE("plain SGD is p -= lr g", "[optim]") {
  std::vector<float> p{1.0f, 2.0f};
  const std::vector<float> g{0.5f, -4.0f};
  SGD sgd(2, SGDOptions{0.25f, 0.0f, 0.0f});
  sgd.step(p, g);
  sgd.step(p, g);
  REQUIRE(p[0] == 0.75f);  // 1 - 2 · 0.25 · 0.5, exact in float32
  REQUIRE(p[1] == 4.0f);   // 2 + 2 · 0.25 · 4
}

TEST_CASE("AdamW matches torch.optim.AdamW by hand over 3 steps", "[optim]") {
  // Large lr and weight decay so that both the decay and the bias correction move the result
  // far beyond the tolerance; two segments (3 + 2 elements), each with its own step count.
  const double lr = 0.1f, b1 = 0.9f, b2 = 0.999f, eps = 1e-8f,
               wd = 0.1f;  // float32 values, as AdamWOptions
  AdamWOptions o;
  o.lr = 0.1f;
  o.weight_decay = 0.1f;
  std::vector<float> p = kInit;
  AdamW adamw({3, 2}, o);
  std::vector<double> ref(kInit.begin(), kInit.end()), m(p.size()), v(p.size());
  for (size_t t = 1; t <= kGrads.size(); ++t) {
    adamw.step(p, kGrads[t - 1]);
    for (size_t i = 0; i < p.size(); ++i) {
      const double g = kGrads[t - 1][i];
      ref[i] *= 1 - lr * wd;  // decoupled weight decay, applied to the parameter first
      m[i] = b1 * m[i] + (1 - b1) * g;
      v[i] = b2 * v[i] + (1 - b2) * g * g;
      const double m_hat = m[i] / (1 - std::pow(b1, t));
      const double v_hat = v[i] / (1 - std::pow(b2, t));
      ref[i] -= lr * m_hat / (std::sqrt(v_hat) + eps);
    }
    INFO("after step " << t);
    require_close(p, ref);
    require_close(adamw.exp_avg(), m);
    require_close(adamw.exp_avg_sq(), v);
  }
  REQUIRE(adamw.segment_steps() == std::vector<int64_t>{3, 3});
  // Step 1 of Adam moves every element with g != 0 by lr (m̂ / sqrt(v̂) = ±1): bias correction
  // at work. With g = 0 (element 4, step 2) only the decay and the momentum act.
}

TEST_CASE("AdamW defaults are torch's and bad options are refused", "[optim]") {
  AdamWOptions o;
  REQUIRE(o.lr == 1e-3f);
  REQUIRE(o.beta1 == 0.9f);
  REQUIRE(o.beta2 == 0.999f);
  REQUIRE(o.eps == 1e-8f);
  REQUIRE(o.weight_decay == 1e-2f);
  o.lr = 0;
  REQUIRE_THROWS_WITH(AdamW({1}, o), Contains("lr"));
  o = AdamWOptions{};
  o.beta2 = 1.0f;
  REQUIRE_THROWS_WITH(AdamW({1}, o), Contains("betas"));
  AdamW ok({2, 3});
  std::vector<float> p(4), g(4);
  REQUIRE_THROWS_WITH(ok.step(p, g), Contains("state for 5"));
  REQUIRE_THROWS_WITH(SGD(1, SGDOptions{-1.0f, 0, 0}), Contains("lr"));
}

TEST_CASE("clip_grad_norm scales to max_norm like torch.nn.utils.clip_grad_norm_", "[optim]") {
  std::vector<float> g{3.0f, 4.0f, 0.0f};  // norm 5
  REQUIRE(clip_grad_norm(g, 1.0f) == 5.0);
  const double coef = 1.0 / (5.0 + 1e-6);  // torch: max_norm / (total_norm + 1e-6)
  REQUIRE(g[0] == Approx(3.0 * coef).epsilon(1e-7));
  REQUIRE(g[1] == Approx(4.0 * coef).epsilon(1e-7));
  REQUIRE(g[2] == 0.0f);
  REQUIRE(std::sqrt(sum_of_squares(g)) <= 1.0);

  std::vector<float> small{0.3f,
                           0.4f};  // norm 0.5 < max_norm: untouched (coefficient clamped to 1)
  REQUIRE(clip_grad_norm(small, 1.0f) == Approx(0.5).epsilon(1e-7));
  REQUIRE(small[0] == 0.3f);
  REQUIRE(small[1] == 0.4f);
  REQUIRE(clip_coefficient(0.5, 1.0f) == 1.0f);
  REQUIRE(sum_of_squares(std::vector<float>{1.0f, 2.0f, 2.0f}) == 9.0);
  REQUIRE_THROWS_WITH(clip_grad_norm(g, 0.0f), Contains("--clip-grad-norm"));
}
