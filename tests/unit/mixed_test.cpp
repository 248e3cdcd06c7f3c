// Mixed precision (common/precision/mixed.hpp, grad_scaler.hpp, mixed_precision.hpp):
//  - HalfStorage + linear_half on a small MLP, forward and two accumulated backwards, BIT FOR
//    BIT against the rules written out here with the fp32 kernels (ops.hpp) and explicit
//    roundings: inputs, outputs and incoming gradients of every Linear rounded to 16 bits,
//    products accumulated in fp32, each backward's parameter gradient rounded and then added
//    in 16 bits. The kernels and summation order are the same on both sides, so any
//    difference is a misplaced (or missing) rounding or a wrong buffer: no tolerance.
//  - the ledger: 2Ψ parameters, 2Ψ gradients, 12Ψ optimizer state (K = 12), fp32 buffers freed.
//  - MasterWeights: bit for bit AdamW::step on the widened gradients; params16 = to_16(master).
//  - GradScaler: torch.cuda.amp.GradScaler's update rule step by step.
#include <catch2/catch.hpp>

#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "common/core/ops.hpp"
#include "common/driver/train.hpp"
#include "common/precision/mixed.hpp"
#include "common/precision/mixed_precision.hpp"
#include "common/zero/zero_memory.hpp"
#include "util.hpp"

using namespace ringzero;
using namespace ringzero::test;
using Catch::Matchers::Contains;

namespace {

Tensor rounded(const Tensor& t, Dtype d) {
  Tensor c = Tensor::zeros(t.shape(), MemTag::activations);
  std::copy(t.data(), t.data() + t.numel(), c.data());
  round_in_place(d, c.span());
  return c;
}

// The reference: one micro-batch of Linear(5, 4), ReLU, Linear(4, 3), MSE, with the roundings
// written out; returns the loss and ADDS each parameter's gradient (rounded) into grads16
// with one 16-bit accumulation, as the storage scheme documents.
float reference_step(Dtype d, const std::vector<float>& p32, std::vector<uint16_t>& grads16,
                     const Tensor& x, const Tensor& y) {
  // Parameters, 16-bit values (Model layout: 0.weight (4,5), 0.bias (4), 2.weight (3,4), 2.bias).
  std::vector<float> p(p32);
  round_in_place(d, p);
  Tensor w1(p.data(), {4, 5}), b1(p.data() + 20, {4}), w2(p.data() + 24, {3, 4}),
      b2(p.data() + 36, {3});
  const int64_t B = x.rows();
  Tensor x16 = rounded(x, d);
  Tensor a1 = Tensor::zeros({B, 4}, MemTag::activations);
  linear_forward(a1, x16, w1, b1);
  round_in_place(d, a1.span());
  Tensor h = Tensor::zeros({B, 4}, MemTag::activations);
  relu_forward(h, a1);
  Tensor a2 = Tensor::zeros({B, 3}, MemTag::activations);
  linear_forward(a2, h, w2, b2);
  round_in_place(d, a2.span());
  const float loss = mse_forward(a2, y);  // fp32
  Tensor da2 = Tensor::zeros({B, 3}, MemTag::activations);
  mse_backward(da2, 1.0f, a2, y);
  Tensor da2_16 = rounded(da2, d);
  std::vector<float> g(39, 0.0f);
  Tensor gw1(g.data(), {4, 5}), gb1(g.data() + 20, {4}), gw2(g.data() + 24, {3, 4}),
      gb2(g.data() + 36, {3});
  Tensor dh = Tensor::zeros({B, 4}, MemTag::activations);
  linear_backward(dh, gw2, gb2, da2_16, h, w2);
  round_in_place(d, dh.span());
  Tensor da1 = Tensor::zeros({B, 4}, MemTag::activations);
  relu_backward(da1, dh, h);
  Tensor da1_16 = rounded(da1, d);
  linear_backward(Tensor(), gw1, gb1, da1_16, x16, w1);
  std::vector<uint16_t> g16(39);
  convert_to_half(d, g, g16);
  accumulate_half(d, grads16, g16);
  return loss;
}

}  // namespace

TEST_CASE("HalfStorage + linear_half: forward, backward and 16-bit accumulation, bitwise",
          "[mixed]") {
  for (Dtype d : {Dtype::bf16, Dtype::fp16}) {
    INFO(dtype_name(d));
    const Ledger& L = Ledger::get();
    const int64_t params0 = L.current(MemTag::parameters), grads0 = L.current(MemTag::gradients);
    Model model({5, 4, 3}, /*seed=*/7);
    const std::vector<float> init(model.params_memory.data(), model.params_memory.data() + 39);
    HalfStorage storage(model, d);
    REQUIRE(model.num_parameters() == 39);
    REQUIRE(L.current(MemTag::parameters) - params0 == 2 * 39);  // the fp32 copy is freed
    REQUIRE(L.current(MemTag::gradients) - grads0 == 2 * 39);

    std::vector<uint16_t> expected(39, 0);
    for (uint64_t micro = 0; micro < 2; ++micro) {  // two micro-batches accumulate
      Tensor x = randn({3, 5}, 11, micro), y = randn({3, 3}, 12, micro);
      const float want = reference_step(d, init, expected, x, y);
      Tape tape;
      Batch batch{x, y, {}};
      Var loss = forward_loss(tape, model, batch);
      REQUIRE(loss->value[0] == want);
      tape.backward(loss);
      for (size_t i = 0; i < 39; ++i) {
        INFO("micro-batch " << micro << ", gradient element " << i);
        REQUIRE(storage.grads16.span()[i] == expected[i]);
      }
    }
    REQUIRE(storage.params_as_float()[3] == half_to_float(d, float_to_half(d, init[3])));
    storage.zero_grad();
    REQUIRE(storage.grads16.span()[0] == 0);
  }
}

TEST_CASE("MasterWeights is AdamW on the fp32 master; K = 12 bytes per parameter", "[mixed]") {
  const std::vector<float> init{1.0f, -2.0f, 0.5f, 3.0f, -0.1f, 0.001f, 7.0f};
  const std::vector<int64_t> segments{4, 3};
  AdamWOptions o;
  o.lr = 0.01f;
  for (Dtype d : {Dtype::bf16, Dtype::fp16}) {
    INFO(dtype_name(d));
    const int64_t state0 = Ledger::get().current(MemTag::optimizer_state);
    MasterWeights master(d, init, segments, o);
    REQUIRE(Ledger::get().current(MemTag::optimizer_state) - state0 == 12 * 7);
    AdamW adam(segments, o);
    std::vector<float> ref(init);
    std::vector<uint16_t> p16(7), g16(7);
    convert_to_half(d, init, p16);
    const float factor = 0.25f;  // e.g. 1/scale of a loss scale of 4
    Rng rng(3, 0);
    for (int step = 0; step < 5; ++step) {
      std::vector<float> g(7);
      for (float& v : g) v = rng.normal() * 4.0f;
      convert_to_half(d, g, g16);
      std::vector<float> widened(7);
      convert_to_float(d, g16, widened);
      for (float& v : widened) v *= factor;
      master.step(p16, g16, factor);
      adam.step(ref, widened);
      for (size_t i = 0; i < 7; ++i) {
        INFO("step " << step << ", element " << i);
        REQUIRE(std::memcmp(&master.master()[i], &ref[i], 4) == 0);
        REQUIRE(master.exp_avg()[i] == adam.exp_avg()[i]);
        REQUIRE(master.exp_avg_sq()[i] == adam.exp_avg_sq()[i]);
        REQUIRE(p16[i] == float_to_half(d, ref[i]));
      }
    }
    REQUIRE(master.segment_steps() == std::vector<int64_t>{5, 5});
    // The master moves by less than a bf16 ulp where the 16-bit parameter cannot: the reason
    // the master is kept in fp32 (Micikevicius et al. 2018, §3.1).
    REQUIRE(master.master()[6] != half_to_float(d, p16[6]));
  }
  REQUIRE_THROWS_WITH(MasterWeights(Dtype::bf16, init, {4, 4}),
                      Contains("segments sum to 8, 7 values"));
}

TEST_CASE("GradScaler: torch.cuda.amp.GradScaler's defaults and update rule", "[mixed]") {
  GradScaler s;
  REQUIRE(s.scale() == 65536.0f);
  REQUIRE(s.inv_scale() == 1.0f / 65536.0f);
  REQUIRE_FALSE(s.update(true));  // overflow: skip, halve
  REQUIRE(s.scale() == 32768.0f);
  REQUIRE(s.skipped_steps() == 1);
  for (int i = 0; i < 1999; ++i) REQUIRE(s.update(false));
  REQUIRE(s.scale() == 32768.0f);  // 1999 clean steps: not yet
  REQUIRE(s.growth_tracker() == 1999);
  REQUIRE(s.update(false));  // the 2000th: double, tracker restarts
  REQUIRE(s.scale() == 65536.0f);
  REQUIRE(s.growth_tracker() == 0);
  for (int i = 0; i < 1000; ++i) s.update(false);
  REQUIRE_FALSE(s.update(true));  // an overflow resets the clean-step count
  REQUIRE(s.growth_tracker() == 0);
  REQUIRE(s.scale() == 32768.0f);
  REQUIRE(s.skipped_steps() == 2);
  REQUIRE_THROWS_WITH(GradScaler(GradScalerOptions{0.0f}), Contains("init_scale"));
}

TEST_CASE("non-finite detection and the norm of 16-bit gradients", "[mixed]") {
  std::vector<uint16_t> g{float_to_fp16(1.0f), float_to_fp16(-2.0f), float_to_fp16(0.5f)};
  REQUIRE_FALSE(has_non_finite(Dtype::fp16, g));
  REQUIRE(sum_of_squares_half(Dtype::fp16, g, 0.5f) == 0.25 + 1.0 + 0.0625);
  g.push_back(float_to_fp16(70000.0f));  // overflows to inf
  REQUIRE(has_non_finite(Dtype::fp16, g));
  std::vector<uint16_t> b{float_to_bf16(1e30f), float_to_bf16(std::nanf(""))};
  REQUIRE(has_non_finite(Dtype::bf16, b));
  REQUIRE_FALSE(has_non_finite(Dtype::bf16, std::span<const uint16_t>(b).first(1)));
}

TEST_CASE(
    "MixedPrecision: the ledger equals the calculator's mixed-precision DDP row; fp16 "
    "skips an overflowing step without advancing Adam",
    "[mixed]") {
  TrainConfig config;
  config.model = "toy";
  config.hidden_sizes = {16};  // 1024 -> 16 -> 256
  const Ledger& L = Ledger::get();
  const int64_t p0 = L.current(MemTag::parameters), g0 = L.current(MemTag::gradients),
                o0 = L.current(MemTag::optimizer_state);
  Model model(config.layer_sizes(), 1);
  const int64_t psi = model.num_parameters();
  for (const char* p : {"bf16", "fp16"}) {
    INFO(p);
    config.precision = p;
    Model m(config.layer_sizes(), 1);
    const int64_t pm = L.current(MemTag::parameters), gm = L.current(MemTag::gradients);
    MixedPrecision mixed(m, config);
    // The model's fp32 buffers (4Ψ each) are gone; what remains is the 16-bit state.
    const ModelStateBytes calc =
        zero_model_state_bytes(0, static_cast<double>(psi), 1, kMixedPrecisionAdam);
    REQUIRE(L.current(MemTag::parameters) - (pm - 4 * psi) ==
            static_cast<int64_t>(calc.parameters));
    REQUIRE(L.current(MemTag::gradients) - (gm - 4 * psi) == static_cast<int64_t>(calc.gradients));
    REQUIRE(L.current(MemTag::optimizer_state) - o0 == static_cast<int64_t>(calc.optimizer_state));
    REQUIRE(calc.total() == 16.0 * psi);

    Tensor x = randn({4, 1024}, 2), y = randn({4, 256}, 3);
    Batch batch{x, y, {}};
    mixed.zero_grad();
    Tape tape;
    Var loss = forward_loss(tape, m, batch);
    tape.backward(loss, mixed.loss_scale());
    if (std::string(p) == "fp16") {
      mixed.storage().grads16.span()[5] = 0x7c00;  // +inf: an overflow on this rank
      const std::vector<float> before(mixed.master().master().begin(),
                                      mixed.master().master().end());
      REQUIRE_FALSE(mixed.step(0.0f, nullptr));
      REQUIRE(mixed.summary()["skipped_steps"] == 1);
      REQUIRE(mixed.summary()["loss_scale"] == 32768.0);
      REQUIRE(mixed.master().segment_steps()[0] == 0);  // Adam's step did not advance
      REQUIRE(std::equal(before.begin(), before.end(), mixed.master().master().begin()));
      mixed.storage().grads16.span()[5] = 0;
    }
    REQUIRE(mixed.step(0.0f, nullptr));
    REQUIRE(mixed.master().segment_steps()[0] == 1);
  }
  (void)g0;
  (void)p0;
}

TEST_CASE(
    "MixedPrecision for data parallel: fp32 gradients step as their 16-bit source, "
    "update_scale/step_master equal step, a rank without master weights holds 4Ψ",
    "[mixed]") {
  TrainConfig config;
  config.model = "toy";
  config.hidden_sizes = {16};  // 1024 -> 16 -> 256
  config.clip_grad_norm = 0.5f;
  for (const char* p : {"bf16", "fp16"}) {
    INFO(p);
    config.precision = p;
    Model ma(config.layer_sizes(), 1), mb(config.layer_sizes(), 1);
    MixedPrecision a(ma, config), b(mb, config);
    REQUIRE(a.reduce_dtype() == parse_dtype(p, "--precision"));
    Tensor x = randn({4, 1024}, 2), y = randn({4, 256}, 3);
    for (MixedPrecision* mp : {&a, &b}) {
      Model& m = mp == &a ? ma : mb;
      mp->zero_grad();
      Tape tape;
      Var loss = forward_loss(tape, m, Batch{x, y, {}});
      tape.backward(loss, mp->loss_scale());
    }
    // a: 16-bit gradients; b: the same values widened to fp32 (what --reduce-dtype fp32 sums
    // and then hands over): the same master update, bit for bit, clipping included.
    std::vector<float> g32 = b.storage().params_as_float();  // sized Ψ
    convert_to_float(b.dtype(), b.storage().grads16.span(), g32);
    REQUIRE(a.step(config.clip_grad_norm, nullptr));
    REQUIRE(b.update_scale(b.found_inf(g32), nullptr));
    b.step_master(config.clip_grad_norm, g32);
    REQUIRE(std::memcmp(a.master().master().data(), b.master().master().data(),
                        4 * a.master().master().size()) == 0);
    REQUIRE(a.master().segment_steps() == b.master().segment_steps());
    if (std::string(p) == "fp16") {  // an inf in the fp32 gradients: the step is skipped
      g32[7] = std::numeric_limits<float>::infinity();
      REQUIRE(b.found_inf(g32));
      REQUIRE_FALSE(b.update_scale(true, nullptr));
      REQUIRE(b.summary()["skipped_steps"] == 1);
    } else {
      REQUIRE_FALSE(b.found_inf(g32));  // bf16: no loss scale, nothing to skip
    }
  }
  // Chapter 03's ranks 1..N-1: the 16-bit model only (2Ψ + 2Ψ), no optimizer state.
  config.precision = "bf16";
  const Ledger& L = Ledger::get();
  const int64_t o0 = L.current(MemTag::optimizer_state);
  Model m(config.layer_sizes(), 1);
  MixedPrecision replica(m, config, /*master_weights=*/false);
  REQUIRE(L.current(MemTag::optimizer_state) == o0);
  REQUIRE_FALSE(replica.has_master_weights());
  REQUIRE_THROWS_WITH(replica.step_master(0.0f), Contains("no master weights"));
  // --reduce-dtype fp32 is read as given. Which values are allowed is checked once, before any
  // chapter is built (PrecisionCheck, common/driver/run.cpp): tests/chapters/mixed_ch03.sh and
  // mixed_zero3.sh check its refusals.
  config.reduce_dtype = "fp32";
  Model m32(config.layer_sizes(), 1);
  REQUIRE(MixedPrecision(m32, config).reduce_dtype() == Dtype::fp32);
}
