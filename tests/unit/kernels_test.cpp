// The shared element kernels (common/core/kernels.hpp) on the CPU: the functions the GPU kernels in
// common/device/gpu/kernels.cu call, checked against values worked out by hand or in double here.
// The ops and optimizers that loop over them are tested further in ops_test and optim_test;
// these cases pin the edge behaviour both devices must share (ReLU at -0.0 and NaN, the label
// term of cross-entropy, SGD's first momentum step).
#include <catch2/catch.hpp>

#include <cmath>
#include <limits>
#include <vector>

#include "common/core/kernels.hpp"
#include "common/core/optim.hpp"

using namespace ringzero;

TEST_CASE("relu and its gradient keep -0.0, NaN and the x = 0 convention", "[kernels]") {
  CHECK(kernels::relu(2.5f) == 2.5f);
  CHECK(kernels::relu(-2.5f) == 0.0f);
  CHECK(std::signbit(kernels::relu(-0.0f)));  // as std::max(-0.0f, 0.0f) and Eigen's cwiseMax
  CHECK(std::isnan(kernels::relu(std::numeric_limits<float>::quiet_NaN())));
  CHECK(kernels::relu_grad(3.0f, 1e-30f) == 3.0f);
  CHECK(kernels::relu_grad(3.0f, 0.0f) == 0.0f);  // PyTorch: gradient 0 at x = 0
}

TEST_CASE("column_sum adds the rows of one column in row order", "[kernels]") {
  // 1e8 + 1 - 1e8 in row order is 0 in float32 (1 is lost against 1e8); any other order of the
  // three rows that adds 1 last, or -1e8 first, gives another answer, so the order is pinned.
  const std::vector<float> d{1e8f, 5.0f, 1.0f, 6.0f, -1e8f, 7.0f};  // (3, 2)
  CHECK(kernels::column_sum(d.data(), 3, 2, 0) == 0.0f);
  CHECK(kernels::column_sum(d.data(), 3, 2, 1) == 18.0f);
}

TEST_CASE("softmax_cross_entropy_row matches logsumexp in double", "[kernels]") {
  const std::vector<float> z{1.0f, 2.0f, 3.0f, 1000.0f};  // 1000: exp would overflow unshifted
  std::vector<float> p(4);
  const double nll = kernels::softmax_cross_entropy_row(z.data(), p.data(), 4, 2);
  // logsumexp = 1000 + log(1 + e^-997 + e^-998 + e^-999) = 1000 to double precision.
  CHECK(nll == Approx(1000.0 - 3.0).epsilon(1e-15));
  CHECK(p[3] == 1.0f);
  CHECK(p[0] == 0.0f);  // e^-999 underflows float32
  const std::vector<float> z2{0.0f, std::log(3.0f)};
  const double nll2 = kernels::softmax_cross_entropy_row(z2.data(), p.data(), 2, 0);
  CHECK(nll2 == Approx(std::log(4.0)).epsilon(1e-7));  // log(1 + 3) - 0; z2[1] rounded to float
  CHECK(p[0] == Approx(0.25).epsilon(1e-7));
  CHECK(kernels::cross_entropy_grad(0.25f, true, 0.5f) == -0.375f);
  CHECK(kernels::cross_entropy_grad(0.75f, false, 0.5f) == 0.375f);
}

TEST_CASE("mse terms and gradient", "[kernels]") {
  CHECK(kernels::squared_error(1.5f, -0.5f) == 4.0);
  CHECK(kernels::mse_grad(1.5f, -0.5f, 0.25f) == 0.5f);
  CHECK(kernels::square(-3.0f) == 9.0);
  // float64: 1e30² overflows float32 but not double
  CHECK(kernels::square(1e30f) == Approx(1e60).epsilon(1e-7));
}

TEST_CASE("adamw_update, one step from zero state, by hand", "[kernels]") {
  AdamWOptions o;  // lr 1e-3, betas (0.9, 0.999), eps 1e-8, wd 1e-2
  const kernels::AdamWStep k = adamw_step_constants(o, 1);
  float p = 2.0f, m = 0.0f, v = 0.0f;
  kernels::adamw_update(p, m, v, 0.5f, k);
  // Step 1: m = 0.05, v = 0.00025, m̂ = 0.5, sqrt(v̂) = 0.5: p = 2 (1 - 1e-5) - 1e-3 * 0.5 / (0.5 +
  // 1e-8) = 1.99998 - 0.00099999998. float32 rounding of each term: 1e-7 relative.
  // 1 - 0.9f = 0.100000024 and 1 - 0.999f = 0.00099998713 in float32 (the options hold floats):
  // 2.4e-7 and 1.3e-5 relative, hence the tolerances of m and v.
  CHECK(m == Approx(0.05).epsilon(5e-7));
  CHECK(v == Approx(0.00025).epsilon(2e-5));
  CHECK(p == Approx(2.0 * (1 - 1e-5) - 1e-3 * 0.5 / (0.5 + 1e-8)).epsilon(1e-7));
}

TEST_CASE("sgd_update: weight decay, first momentum step, then momentum", "[kernels]") {
  float p = 1.0f, buf = 123.0f;  // buf's old value must be ignored on the first step
  kernels::sgd_update(p, buf, 0.5f, 0.1f, 0.9f, 0.5f, /*first_step=*/true);
  CHECK(buf == 1.0f);  // d = 0.5 + 0.5 * 1
  CHECK(p == 0.9f);
  kernels::sgd_update(p, buf, 0.5f, 0.1f, 0.9f, 0.5f, /*first_step=*/false);
  CHECK(buf == Approx(0.9 + 0.95).epsilon(1e-7));  // d = 0.5 + 0.45, buf = 0.9 * 1 + 0.95
  CHECK(p == Approx(0.9 - 0.1 * 1.85).epsilon(1e-7));
  float q = 1.0f, unused = 7.0f;
  kernels::sgd_update(q, unused, 0.5f, 0.1f, 0.0f, 0.0f, true);
  CHECK(q == 0.95f);
  CHECK(unused == 7.0f);  // no momentum: buf untouched
}
