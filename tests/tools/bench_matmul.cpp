// bench_matmul: GFLOP/s of the library's linear kernels against raw Eigen GEMMs on the same
// shapes, on one thread (scripts/bench.d/02-matmul.sh runs it).
//
//   bench_matmul [--seconds 2]
//
// Shapes (B, C, OC): (64, 1024, 1024) and (64, 1024, 256), the ToyModel's layers, and
// (64, 784, 512), the MLP's first. FLOPs counted: forward 2 B C OC (out = inp Wᵀ), backward
// 4 B C OC (dinp += dout W, dW += doutᵀ inp); the bias terms are B·OC, under 0.1 %, and not
// counted. "Raw Eigen" is the bare GEMMs on Eigen::Matrix objects (no bias, plain =); ours is
// linear_forward / linear_backward on Tensor views (Eigen::Map, bias add, += accumulation, shape
// checks). Overhead = our time / raw Eigen time - 1; the goal is <= 10 %.
// Timing: this thread's CPU time (CLOCK_THREAD_CPUTIME_ID), so time spent descheduled by other
// processes does not count; trials of ours and raw Eigen alternate, each ~50 ms, and the FASTEST
// trial of each counts, the usual choice for a kernel benchmark: interference only ever adds
// time, so the minimum is the most repeatable estimate of the kernel's own cost (wall-clock
// medians swing by tens of percent on a loaded 2-core machine).
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <functional>
#include <vector>

#include "common/core/ops.hpp"
#include "common/core/rng.hpp"

using namespace ringzero;
using RowMajor = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

namespace {

void fill(std::span<float> values, uint64_t seed) {
  Rng rng(seed);
  for (float& v : values) v = rng.uniform(-1.0f, 1.0f);
}

double thread_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

double seconds_of(const std::function<void()>& f, int iterations) {
  const double start = thread_seconds();
  for (int i = 0; i < iterations; ++i) f();
  return (thread_seconds() - start) / iterations;
}

// Fastest seconds per call of a and of b over alternating trials of ~50 ms each.
std::pair<double, double> time_pair(const std::function<void()>& a, const std::function<void()>& b,
                                    double budget_s) {
  a(), b();  // warm-up: page in, fill caches
  const int iterations = std::max(1, static_cast<int>(0.05 / std::max(1e-7, seconds_of(a, 3))));
  std::vector<double> ta, tb;
  const auto start = std::chrono::steady_clock::now();
  while (
      ta.size() < 5 ||
      (std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() < budget_s &&
       ta.size() < 41)) {
    ta.push_back(seconds_of(a, iterations));
    tb.push_back(seconds_of(b, iterations));
  }
  return {*std::min_element(ta.begin(), ta.end()), *std::min_element(tb.begin(), tb.end())};
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"GFLOP/s of linear_forward/linear_backward vs raw Eigen GEMMs, one thread"};
  double seconds = 2.0;
  app.add_option("--seconds", seconds,
                 "time budget per shape and direction (at least 5 trials each)");
  CLI11_PARSE(app, argc, argv);

  std::printf("%-18s %-9s %14s %14s %12s\n", "(B, C, OC)", "kernel", "ours GFLOP/s",
              "Eigen GFLOP/s", "overhead");
  double worst = -1;
  for (auto [B, C, OC] :
       std::vector<std::array<int64_t, 3>>{{64, 1024, 1024}, {64, 1024, 256}, {64, 784, 512}}) {
    // Ours: tensors as the library holds them.
    Tensor inp = Tensor::zeros({B, C}, MemTag::activations),
           weight = Tensor::zeros({OC, C}, MemTag::parameters),
           bias = Tensor::zeros({OC}, MemTag::parameters),
           out = Tensor::zeros({B, OC}, MemTag::activations),
           dout = Tensor::zeros({B, OC}, MemTag::activations),
           dinp = Tensor::zeros({B, C}, MemTag::activations),
           dweight = Tensor::zeros({OC, C}, MemTag::gradients),
           dbias = Tensor::zeros({OC}, MemTag::gradients);
    fill(inp.span(), 1), fill(weight.span(), 2), fill(bias.span(), 3), fill(dout.span(), 4);
    // Raw Eigen: the same values in plain matrices.
    const RowMajor X = inp.mat(), W = weight.mat(), dO = dout.mat();
    RowMajor O(B, OC), dX(B, C), dW(OC, C);

    const double flops = 2.0 * static_cast<double>(B * C * OC);
    char shape[32];
    std::snprintf(shape, sizeof shape, "(%lld, %lld, %lld)", static_cast<long long>(B),
                  static_cast<long long>(C), static_cast<long long>(OC));
    auto report = [&](const char* kernel, double ours_s, double eigen_s, double kernel_flops) {
      const double overhead = ours_s / eigen_s - 1.0;
      worst = std::max(worst, overhead);
      std::printf("%-18s %-9s %14.1f %14.1f %11.1f%%\n", shape, kernel, kernel_flops / ours_s / 1e9,
                  kernel_flops / eigen_s / 1e9, 100.0 * overhead);
    };
    auto [f_ours, f_eigen] = time_pair([&] { linear_forward(out, inp, weight, bias); },
                                       [&] { O.noalias() = X * W.transpose(); }, seconds / 2);
    report("forward", f_ours, f_eigen, flops);
    auto [b_ours, b_eigen] =
        time_pair([&] { linear_backward(dinp, dweight, dbias, dout, inp, weight); },
                  [&] {
                    dX.noalias() = dO * W;
                    dW.noalias() = dO.transpose() * X;
                  },
                  seconds / 2);
    report("backward", b_ours, b_eigen, 2 * flops);
    // Keep the results observable so nothing is optimised away.
    if (!(out[0] == out[0]) || !(O(0, 0) == O(0, 0)) || !(dX(0, 0) == dX(0, 0)) ||
        !(dW(0, 0) == dW(0, 0)) || !(dinp[0] == dinp[0]) || !(dweight[0] == dweight[0]))
      std::printf("(non-finite values)\n");
  }
  std::printf("worst overhead: %.1f%% (goal: <= 10%%)\n", 100.0 * worst);
  return 0;
}
