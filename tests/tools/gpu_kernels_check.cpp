// gpu_kernels_check: every GPU kernel of common/device/gpu/ against the CPU code on the same
// inputs, the device column of the ledger against cudaMemGetInfo, and SGEMM TFLOP/s against a peak.
//
//   build-cuda/tests/gpu_kernels_check [--peak-tflops 67]
//
// Element kernels (ReLU and its backward, bias add, bias gradient, cross-entropy backward on
// the same probabilities, SGD, the bf16/fp16 conversions) run the very function the CPU runs, so
// they must agree BITWISE (the conversions exactly: integer bit operations, nothing to contract)
// unless a compiler contracted a multiply-add differently (GCC -march=native and nvcc both
// contract): for those the bound is 2 ulp (relative 2.4e-7). AdamW: 4 ulp (its chain has four
// roundings a contraction can move). Reductions in float64 (MSE sum, sum of squares) add in
// another order: relative 1e-12. Softmax cross-entropy: glibc's and CUDA's exp/log in float64
// may differ in the last bit of a double, then rounded to float: probabilities within 2 ulp,
// the batch loss (a float64 sum rounded to float) within one float ulp (1.2e-7 relative). cuBLAS vs
// Eigen: sums of C products in another order, bound C · 2^-24 · Σ|a||b| per element (the standard
// dot-product error bound, Higham 2002, §3.1), checked as |diff| <= 1e-6 · C · max|a| · max|b|.
// Exits 77 (ctest "skipped") when no CUDA device is visible.
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "common/core/check.hpp"
#include "common/core/half.hpp"
#include "common/core/ops.hpp"
#include "common/core/optim.hpp"
#include "common/core/rng.hpp"
#include "common/device/gpu/device.hpp"
#include "common/device/gpu/nccl_transport.hpp"

using namespace ringzero;

namespace {

int failures = 0;

std::vector<float> random(int64_t n, uint64_t seed, float lo = -2.0f, float hi = 2.0f) {
  Rng rng(seed, 7);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = rng.uniform(lo, hi);
  return v;
}

DeviceBuffer upload(const std::vector<float>& v) {
  DeviceBuffer d(static_cast<int64_t>(v.size()), MemTag::activations);
  d.copy_from_host(v.data(), static_cast<int64_t>(v.size()));
  return d;
}

std::vector<float> download(const DeviceBuffer& d) {
  std::vector<float> v(static_cast<size_t>(d.size()));
  d.copy_to_host(v.data(), d.size());
  return v;
}

// Max difference in units of float32 rounding (ulp at the larger magnitude); 0 = bitwise.
double max_ulps(const std::vector<float>& a, const std::vector<float>& b) {
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::memcmp(&a[i], &b[i], 4) == 0) continue;
    const double scale = std::max({std::fabs(a[i]), std::fabs(b[i]), 1e-30f});
    worst = std::max(worst,
                     std::fabs(static_cast<double>(a[i]) - b[i]) / (scale * std::ldexp(1.0, -23)));
  }
  return worst;
}

void report(const char* what, double measured, double bound, const char* unit) {
  const bool ok = measured <= bound;
  std::printf("%-4s %-36s %12.3g %-4s (bound %g)\n", ok ? "ok" : "FAIL", what, measured, unit,
              bound);
  if (!ok) ++failures;
}

Tensor view(std::vector<float>& v, Shape s) {
  return Tensor(v.data(), std::move(s));
}

}  // namespace

int main(int argc, char** argv) {
  double peak_tflops = 67.0;  // H100/H200 SXM fp32 non-tensor peak (NVIDIA H200 datasheet)
  for (int i = 1; i + 1 < argc; ++i)
    if (std::string(argv[i]) == "--peak-tflops") peak_tflops = std::stod(argv[i + 1]);
  std::string why;
  if (gpu_device_count(&why) == 0) {
    std::printf("SKIP: no CUDA device (%s)\n", why.c_str());
    return 77;
  }
  return run_main([&] {
    const std::string name = require_gpu(0);
    std::printf("device: %s\n", name.c_str());
    const int64_t B = 64, C = 784, OC = 512, n = B * OC;

    {  // ReLU forward and backward
      auto x = random(n, 1), dy = random(n, 2);
      x[0] = -0.0f;
      x[1] = 0.0f;
      std::vector<float> y(n), dx(n, 0.5f);
      relu_forward(view(y, {n}), view(x, {n}));
      relu_backward(view(dx, {n}), view(dy, {n}), view(y, {n}));
      auto dx_d = upload(std::vector<float>(n, 0.5f)), x_d = upload(x), dy_d = upload(dy);
      DeviceBuffer y_d(n, MemTag::activations);
      gpu::relu_forward(y_d.data(), x_d.data(), n);
      gpu::relu_backward(dx_d.data(), dy_d.data(), y_d.data(), n);
      report("relu_forward (ulp)", max_ulps(y, download(y_d)), 0, "ulp");
      report("relu_backward (ulp)", max_ulps(dx, download(dx_d)), 0, "ulp");
    }
    {  // linear forward/backward: cuBLAS vs Eigen, plus bias add and bias gradient
      auto inp = random(B * C, 3), w = random(OC * C, 4, -0.05f, 0.05f), b = random(OC, 5);
      auto dout = random(B * OC, 6);
      std::vector<float> out(B * OC), dinp(B * C, 0.0f), dw(OC * C, 0.0f), db(OC, 0.0f);
      linear_forward(view(out, {B, OC}), view(inp, {B, C}), view(w, {OC, C}), view(b, {OC}));
      linear_backward(view(dinp, {B, C}), view(dw, {OC, C}), view(db, {OC}), view(dout, {B, OC}),
                      view(inp, {B, C}), view(w, {OC, C}));
      auto inp_d = upload(inp), w_d = upload(w), b_d = upload(b), dout_d = upload(dout);
      DeviceBuffer out_d(B * OC, MemTag::activations), dinp_d(B * C, MemTag::activations),
          dw_d(OC * C, MemTag::activations), db_d(OC, MemTag::activations);
      gpu::linear_forward(out_d.data(), inp_d.data(), w_d.data(), b_d.data(), B, C, OC);
      gpu::linear_backward(dinp_d.data(), dw_d.data(), db_d.data(), dout_d.data(), inp_d.data(),
                           w_d.data(), B, C, OC);
      auto maxdiff = [](const std::vector<float>& a, const std::vector<float>& g) {
        double m = 0;
        for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::fabs(double(a[i]) - g[i]));
        return m;
      };
      report("linear_forward |diff| (SGEMM)", maxdiff(out, download(out_d)),
             1e-6 * C * 2.0 * 0.05 + 1e-6 * 2.0, "abs");
      report("linear_backward dinp |diff|", maxdiff(dinp, download(dinp_d)), 1e-6 * OC * 2 * 0.05,
             "abs");
      report("linear_backward dweight |diff|", maxdiff(dw, download(dw_d)), 1e-6 * B * 2 * 2,
             "abs");
      report("bias gradient (ulp)", max_ulps(db, download(db_d)), 0, "ulp");
      // bias add alone: out = 0 + bias, bitwise
      std::vector<float> zero(B * OC, 0.0f), ob(B * OC);
      for (int64_t i = 0; i < B; ++i)
        for (int64_t j = 0; j < OC; ++j) ob[i * OC + j] = 0.0f + b[j];
      auto z_d = upload(zero);
      gpu::bias_add(z_d.data(), b_d.data(), B, OC);
      report("bias_add (ulp)", max_ulps(ob, download(z_d)), 0, "ulp");
    }
    {  // softmax cross-entropy
      const int64_t K = 10;
      auto logits = random(B * K, 7, -8.0f, 8.0f);
      std::vector<int32_t> labels(B);
      for (int64_t i = 0; i < B; ++i) labels[i] = static_cast<int32_t>((i * 7) % K);
      std::vector<float> probs(B * K), dl(B * K, 0.0f);
      const float loss = cross_entropy_forward(view(probs, {B, K}), view(logits, {B, K}), labels);
      cross_entropy_backward(view(dl, {B, K}), 0.25f, view(probs, {B, K}), labels);
      auto logits_d = upload(logits);
      DeviceBuffer probs_d(B * K, MemTag::activations), dl_d(B * K, MemTag::activations);
      auto* labels_d = static_cast<int32_t*>(device_alloc(B * 4, MemTag::activations));
      auto* nll_d = static_cast<double*>(device_alloc(B * 8, MemTag::activations));
      copy_to_device(labels_d, labels.data(), B * 4);
      gpu::cross_entropy_forward(probs_d.data(), nll_d, logits_d.data(), labels_d, B, K);
      std::vector<double> nll(B);
      copy_to_host(nll.data(), nll_d, B * 8);
      double sum = 0;
      for (double x : nll) sum += x;
      const float loss_d = static_cast<float>(sum / B);
      // float64 sums that agree to ~1e-15 can still round to neighbouring floats: one ulp
      report("cross_entropy loss rel diff", std::fabs(double(loss) - loss_d) / loss, 1.2e-7, "rel");
      const auto probs_g = download(probs_d);
      report("softmax probabilities (ulp)", max_ulps(probs, probs_g), 2, "ulp");
      // backward on the CPU's probabilities: the same function, so bitwise
      probs_d.copy_from_host(probs.data(), B * K);
      gpu::cross_entropy_backward(dl_d.data(), probs_d.data(), labels_d, B, K, 0.25f / B);
      report("cross_entropy_backward (ulp)", max_ulps(dl, download(dl_d)), 2, "ulp");
      device_free(labels_d, B * 4, MemTag::activations);
      device_free(nll_d, B * 8, MemTag::activations);
    }
    {  // MSE
      auto pred = random(n, 8), target = random(n, 9);
      std::vector<float> dp(n, 0.0f);
      const float l = mse_forward(view(pred, {B, OC}), view(target, {B, OC}));
      mse_backward(view(dp, {B, OC}), 1.0f, view(pred, {B, OC}), view(target, {B, OC}));
      auto p_d = upload(pred), t_d = upload(target);
      DeviceBuffer dp_d(n, MemTag::activations);
      const double s = gpu::squared_error_sum(p_d.data(), t_d.data(), n);
      gpu::mse_backward(dp_d.data(), p_d.data(), t_d.data(), n, 2.0f / n);
      report("mse loss rel diff", std::fabs(l - static_cast<float>(s / n)) / l, 1.2e-7, "rel");
      report("mse_backward (ulp)", max_ulps(dp, download(dp_d)), 2, "ulp");
    }
    {  // AdamW (3 steps), SGD with momentum (3 steps), sum of squares, scale
      const int64_t m = 1 << 20;
      auto p = random(m, 10), g = random(m, 11);
      std::vector<float> p_cpu = p;
      AdamW adamw({m / 2, m - m / 2}, AdamWOptions{});
      auto p_d = upload(p), g_d = upload(g);
      DeviceBuffer m_d(m, MemTag::optimizer_state), v_d(m, MemTag::optimizer_state);
      for (int t = 1; t <= 3; ++t) {
        adamw.step(p_cpu, g);
        const auto k = adamw_step_constants(AdamWOptions{}, t);
        gpu::adamw_update(p_d.data(), m_d.data(), v_d.data(), g_d.data(), m / 2, k);
        gpu::adamw_update(p_d.data() + m / 2, m_d.data() + m / 2, v_d.data() + m / 2,
                          g_d.data() + m / 2, m - m / 2, k);
      }
      report("adamw 3 steps (ulp)", max_ulps(p_cpu, download(p_d)), 4, "ulp");
      std::vector<float> q_cpu = p;
      SGD sgd(m, SGDOptions{0.1f, 0.9f, 0.01f});
      auto q_d = upload(p);
      DeviceBuffer buf_d(m, MemTag::optimizer_state);
      for (int t = 0; t < 3; ++t) {
        sgd.step(q_cpu, g);
        gpu::sgd_update(q_d.data(), buf_d.data(), g_d.data(), m, 0.1f, 0.9f, 0.01f, t == 0);
      }
      report("sgd momentum 3 steps (ulp)", max_ulps(q_cpu, download(q_d)), 2, "ulp");
      const double ss = sum_of_squares(g), ss_d = gpu::sum_of_squares(g_d.data(), m);
      report("sum_of_squares rel diff", std::fabs(ss - ss_d) / ss, 1e-12, "rel");
      std::vector<float> gs = g;
      scale_in_place(gs, 0.37f);
      gpu::scale(g_d.data(), m, 0.37f);
      report("scale (ulp)", max_ulps(gs, download(g_d)), 0, "ulp");
    }
    {  // bf16/fp16 conversions: the host's bits (one element function: half_kernels.hpp)
      auto x = random(n, 13, -70000.0f, 70000.0f);  // beyond fp16's 65504 too: rounds to inf
      x[0] = std::nanf("");
      x[1] = -INFINITY;
      x[2] = 1e-6f;            // an fp16 subnormal
      x[3] = 1.0f + 0x1p-8f;   // a bf16 tie: rounds to even (1)
      x[4] = 1.0f + 0x1p-11f;  // an fp16 tie
      x[5] = -0.0f;
      for (const bool bf16 : {true, false}) {
        const Dtype dtype = bf16 ? Dtype::bf16 : Dtype::fp16;
        std::vector<uint16_t> h(n), h_gpu(n);
        convert_to_half(dtype, x, h);
        auto x_d = upload(x);
        auto* h_d = static_cast<uint16_t*>(device_alloc(n * 2, MemTag::activations));
        gpu::to_half(bf16, x_d.data(), h_d, n);
        copy_to_host(h_gpu.data(), h_d, n * 2);
        int64_t differ = 0;
        for (int64_t i = 0; i < n; ++i) differ += h[i] != h_gpu[i];
        report(bf16 ? "to_half bf16 (elements differing)" : "to_half fp16 (elements differing)",
               static_cast<double>(differ), 0, "el");
        std::vector<float> back(n);
        convert_to_float(dtype, h, back);
        DeviceBuffer back_d(n, MemTag::activations);
        gpu::to_float(bf16, h_d, back_d.data(), n);
        report(bf16 ? "to_float bf16 (ulp)" : "to_float fp16 (ulp)",
               max_ulps(back, download(back_d)), 0, "ulp");
        // The 16-bit norm of finite values (another summation order: float64 rounding).
        std::vector<uint16_t> g16(n);
        convert_to_half(dtype, random(n, 14), g16);
        copy_to_device(h_d, g16.data(), n * 2);
        const double ss = sum_of_squares_half(dtype, g16, 0.5f),
                     ss_d = gpu::sum_of_squares_half(bf16, h_d, n, 0.5f);
        report(bf16 ? "sum_of_squares_half bf16 rel diff" : "sum_of_squares_half fp16 rel diff",
               std::fabs(ss - ss_d) / ss, 1e-12, "rel");
        device_free(h_d, n * 2, MemTag::activations);
      }
    }
    {  // the ledger's device column against cudaMemGetInfo
      size_t free0 = 0, free1 = 0, total = 0;
      cudaMemGetInfo(&free0, &total);
      const int64_t before = Ledger::get().device_current(MemTag::parameters);
      const int64_t elems = int64_t{1} << 28;  // 1 GiB
      DeviceBuffer big(elems, MemTag::parameters);
      cudaMemGetInfo(&free1, &total);
      const int64_t counted = Ledger::get().device_current(MemTag::parameters) - before;
      const double taken = static_cast<double>(free0) - static_cast<double>(free1);
      std::printf("ledger device column: +%lld bytes counted, cudaMemGetInfo: %.0f bytes taken\n",
                  static_cast<long long>(counted), taken);
      report("ledger vs cudaMemGetInfo |diff|/size", std::fabs(taken - counted) / counted, 0.01,
             "rel");  // the driver rounds allocations up to its page size (2 MiB)
    }
    {  // SGEMM throughput, fp32 (TF32 off) and TF32, 8192^3
      const int64_t N = 8192;
      DeviceBuffer a(N * N, MemTag::activations), b(N * N, MemTag::activations),
          c(N * N, MemTag::activations);
      auto fill = random(N * N, 12);
      a.copy_from_host(fill.data(), N * N);
      b.copy_from_host(fill.data(), N * N);
      for (bool tf32 : {false, true}) {
        gpu::set_tf32(tf32);
        for (int w = 0; w < 2; ++w) gpu::matmul(c.data(), a.data(), b.data(), N, N, N);
        device_synchronize();
        const int iters = 10;
        const auto t0 = std::chrono::steady_clock::now();
        for (int i = 0; i < iters; ++i) gpu::matmul(c.data(), a.data(), b.data(), N, N, N);
        device_synchronize();
        const double s =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / iters;
        const double tflops = 2.0 * N * N * N / s / 1e12;
        std::printf("matmul %lldx%lldx%lld %s: %.1f TFLOP/s = %.2f x the fp32 peak %.1f TFLOP/s\n",
                    static_cast<long long>(N), static_cast<long long>(N), static_cast<long long>(N),
                    tf32 ? "TF32 tensor cores" : "fp32 (TF32 off)", tflops, tflops / peak_tflops,
                    peak_tflops);
      }
      gpu::set_tf32(false);
    }
    std::printf("%s: %d failure(s)\n", failures ? "FAIL" : "PASS", failures);
    return failures ? 1 : 0;
  });
}
