// The CUDA backend (common/device/gpu/cuda_backend.cpp: the DeviceBackend table over the launchers,
// its label copies and float64 partial sums) and the row-major products over a column-major SGEMM
// (common/device/gpu/linear.cpp), run on the CPU through the emulated layer of
// tests/emul/device_emul.cpp, against the host path (Eigen, the autograd tape, Optimizer):
//   - linear forward/backward through sgemm vs Eigen: catches a wrong transpose, leading
//     dimension or beta (which would be off by O(1), not by rounding);
//   - 10 steps of the chapter 01/02 loop with the model on --device cuda (Model::to) vs the same
//     loop on the host: MLP + cross-entropy with AdamW, ToyModel + MSE with SGD momentum and
//     clipping, K = 2 accumulation.
// Tolerance: the element math is the same code, so what differs is the order of each dot
// product's sum (reference SGEMM: k in order; Eigen: blocked and vectorised): float32 rounding,
// ~1e-7 relative per product. After 10 AdamW steps, losses agree within 1e-5 and weights within
// 1e-5 absolute (measured below 1e-6; AdamW moves a weight by at most lr = 1e-3 per step, so a
// rounding-sized change in m / sqrt(v) moves it by far less than 1e-5).
#include <catch2/catch.hpp>

#include <cmath>
#include <vector>

#include "common/comm/comm_thread.hpp"
#include "common/core/device_backend.hpp"
#include "common/core/device_memory.hpp"
#include "common/core/nn.hpp"
#include "common/core/ops.hpp"
#include "common/core/optim.hpp"
#include "common/core/rng.hpp"
#include "common/device/gpu/device.hpp"
#include "common/driver/train.hpp"
#include "tests/emul/stream_log.hpp"

using namespace ringzero;

namespace {

std::vector<float> random(int64_t n, uint64_t seed) {
  Rng rng(seed, 3);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = rng.uniform(-1.0f, 1.0f);
  return v;
}

Batch make_random_batch(const TrainConfig& c, int64_t B, uint64_t seed) {
  const auto sizes = c.layer_sizes();
  Batch b;
  b.x = Tensor::zeros({B, sizes.front()}, MemTag::activations);
  auto x = random(B * sizes.front(), seed);
  std::copy(x.begin(), x.end(), b.x.data());
  if (c.classification()) {
    for (int64_t i = 0; i < B; ++i) b.labels.push_back(static_cast<int32_t>((i * 3 + seed) % 10));
  } else {
    b.y = Tensor::zeros({B, sizes.back()}, MemTag::activations);
    auto y = random(B * sizes.back(), seed + 100);
    std::copy(y.begin(), y.end(), b.y.data());
  }
  return b;
}

// The chapter 01/02 loop (K micro-batches, optional clipping, --optimizer's step) on `model`,
// wherever it lives; returns each step's loss (the mean over micro-batches).
std::vector<double> train(Model& model, const TrainConfig& c, int64_t steps) {
  Optimizer opt(c, parameter_sizes(model));
  const int64_t K = c.grad_accum_steps, B = c.global_batch_size / K;
  std::vector<double> losses;
  for (int64_t t = 0; t < steps; ++t) {
    model.zero_grad();
    double loss_sum = 0;
    for (int64_t k = 0; k < K; ++k) {
      Batch batch = make_random_batch(c, B, static_cast<uint64_t>(t * K + k));
      Tape tape;
      Var loss = forward_loss(tape, model, batch);  // the batch follows the model's device
      loss_sum += loss->value[0];
      tape.backward(loss, 1.0f / K);
    }
    losses.push_back(loss_sum / K);
    if (c.clip_grad_norm > 0) clip_grad_norm(model.grads_memory.span(), c.clip_grad_norm);
    opt.step(model.params_memory.span(), model.grads_memory.span());
  }
  return losses;
}

// The loop on the host and on --device cuda (the CUDA backend over the emulated layer), both
// models from the same seed. Returns the largest differences (loss, weight).
std::pair<double, double> train_both(const TrainConfig& c, int64_t steps) {
  Model cpu(c.layer_sizes(), c.seed), gpu(c.layer_sizes(), c.seed);
  gpu.to(Device::cuda);
  REQUIRE(device_of(gpu.params_memory.data()) == Device::cuda);
  const std::vector<double> loss_cpu = train(cpu, c, steps), loss_gpu = train(gpu, c, steps);
  double max_dloss = 0, max_dw = 0;
  for (size_t t = 0; t < loss_cpu.size(); ++t)
    max_dloss = std::max(max_dloss, std::fabs(loss_cpu[t] - loss_gpu[t]));
  std::vector<float> weights(static_cast<size_t>(gpu.params_memory.size()));
  copy_elements(gpu.params_memory.span(), std::span<float>(weights));
  for (size_t i = 0; i < weights.size(); ++i)
    max_dw = std::max(max_dw, std::fabs(static_cast<double>(cpu.params_memory.data()[i]) -
                                        weights[i]));
  return {max_dloss, max_dw};
}

}  // namespace

TEST_CASE("linear through column-major sgemm matches Eigen", "[device]") {
  const int64_t B = 5, C = 7, OC = 3;
  auto inp = random(B * C, 1), w = random(OC * C, 2), b = random(OC, 3), dout = random(B * OC, 4);
  std::vector<float> out(B * OC), out_d(B * OC), dinp(B * C, 0.5f), dinp_d(B * C, 0.5f),
      dw(OC * C, 0.25f), dw_d(OC * C, 0.25f), db(OC, 0.0f), db_d(OC, 0.0f);
  linear_forward(Tensor(out.data(), {B, OC}), Tensor(inp.data(), {B, C}), Tensor(w.data(), {OC, C}),
                 Tensor(b.data(), {OC}));
  linear_backward(Tensor(dinp.data(), {B, C}), Tensor(dw.data(), {OC, C}), Tensor(db.data(), {OC}),
                  Tensor(dout.data(), {B, OC}), Tensor(inp.data(), {B, C}),
                  Tensor(w.data(), {OC, C}));
  gpu::linear_forward(out_d.data(), inp.data(), w.data(), b.data(), B, C, OC);
  gpu::linear_backward(dinp_d.data(), dw_d.data(), db_d.data(), dout.data(), inp.data(), w.data(),
                       B, C, OC);
  // sums of at most 7 products of values in [-1, 1]: 7 · 2^-24 ≈ 4e-7 is the rounding bound
  for (size_t i = 0; i < out.size(); ++i) CHECK(out_d[i] == Approx(out[i]).margin(1e-6));
  for (size_t i = 0; i < dinp.size(); ++i) CHECK(dinp_d[i] == Approx(dinp[i]).margin(1e-6));
  for (size_t i = 0; i < dw.size(); ++i) CHECK(dw_d[i] == Approx(dw[i]).margin(1e-6));
  for (size_t i = 0; i < db.size(); ++i) CHECK(db_d[i] == db[i]);  // same column_sum: bitwise
  std::vector<float> c(B * OC), c_ref(B * OC, 0.0f), wt(C * OC);   // matmul: inp (B, C) · wᵀ
  for (int64_t i = 0; i < OC; ++i)
    for (int64_t j = 0; j < C; ++j) wt[j * OC + i] = w[i * C + j];
  gpu::matmul(c.data(), inp.data(), wt.data(), B, OC, C);
  for (int64_t i = 0; i < B * OC; ++i) CHECK(c[i] == Approx(out[i] - b[i % OC]).margin(1e-6));
}

TEST_CASE("the CUDA backend trains as the host: MLP, cross-entropy, AdamW", "[device]") {
  TrainConfig c;
  c.model = "mlp";
  c.hidden_sizes = {32, 16};
  c.global_batch_size = 16;
  const auto [dloss, dw] = train_both(c, 10);
  INFO("max |loss diff| " << dloss << ", max |weight diff| " << dw);
  CHECK(dloss < 1e-5);
  CHECK(dw < 1e-5);
}

TEST_CASE("the CUDA backend trains as the host: ToyModel, MSE, SGD, clipping, K = 2",
          "[device]") {
  TrainConfig c;
  c.model = "toy";
  c.hidden_sizes = {24};
  c.global_batch_size = 8;
  c.grad_accum_steps = 2;
  c.optimizer = "sgd";
  c.lr = 1e-2f;
  c.momentum = 0.9f;
  c.clip_grad_norm = 0.5f;
  const auto [dloss, dw] = train_both(c, 10);
  INFO("max |loss diff| " << dloss << ", max |weight diff| " << dw);
  CHECK(dloss < 1e-5);
  CHECK(dw < 1e-5);
}

TEST_CASE("the CUDA backend's state counts in the ledger's device column", "[device]") {
  TrainConfig c;
  c.model = "mlp";
  c.hidden_sizes = {32};
  Model m(c.layer_sizes(), 0);
  m.to(Device::cuda);
  const int64_t before = Ledger::get().device_current(MemTag::optimizer_state);
  const int64_t psi = m.num_parameters();
  {
    Optimizer opt(c, parameter_sizes(m));
    opt.step(m.params_memory.span(), m.grads_memory.span());  // AdamW's m, v follow the params
    CHECK(Ledger::get().device_current(MemTag::optimizer_state) - before == 8 * psi);
  }
  CHECK(Ledger::get().device_current(MemTag::optimizer_state) == before);
  CHECK(Ledger::get().device_current(MemTag::parameters) >= 4 * psi);
}

TEST_CASE("a communication job runs after the work queued before its submit, and finishes it",
          "[device]") {
  // The hand-over of common/comm/comm_thread.hpp on the CUDA backend: submit records an event on
  // the submitting thread's stream, the job's thread makes its own stream wait for exactly that
  // event before the job, and synchronises its stream after it, before wait() returns.
  (void)backend(Device::cuda);  // made, as --device cuda makes it
  CommThread thread;
  std::vector<emul::StreamLog> seen;  // the job thread's log, inside each job
  uint64_t synchronized_after = 0;
  for (int job = 0; job < 3; ++job) {
    const uint64_t ticket = thread.submit([&] { seen.push_back(emul::stream_log()); });
    const uint64_t marked = emul::stream_log().recorded;  // this thread's event for that job
    thread.wait(ticket);
    thread.submit([&] { synchronized_after = emul::stream_log().synchronized; });
    thread.wait_all();
    REQUIRE(seen.size() == static_cast<size_t>(job) + 1);
    CHECK(marked > 0);
    CHECK(seen.back().waited == marked);  // the job waited for the event of its own submit
    CHECK(seen.back().recorded == 0);     // and recorded none of its own
    CHECK(synchronized_after ==
          2 * static_cast<uint64_t>(job) + 1);  // each job finished its stream
  }
}
