// ZeRO-1 and ZeRO-2 in 16 bits (common/precision/shard_precision.hpp, --precision bf16|fp16)
// under mpirun, np 1..4:
//  - two ZeRO-1 (and ZeRO-2) optimizer steps equal, BIT FOR BIT, a serial re-enactment written here
//  from the
//    documented rules, on every rank: each rank's 16-bit gradient of its micro-batch with the
//    backward seed loss_scale/N (chapter 01's HalfStorage, whose rules tests/unit/mixed_test.cpp
//    checks); per padded bucket, chunk c (rank c's shard) summed in ring order — start at rank
//    c + 1, add ranks c + 2, ..., c, each addition in fp32 rounded once to 16 bits; the
//    clip norm as every rank's Σ(g/scale)² over its shards (buckets in plan order) added in rank
//    order; AdamW (AdamW::step, the documented update) on the fp32 master weights with
//    g = fp32(g16)·(1/scale)·coef; the 16-bit parameters = the master rounded to nearest even.
//    Checked: the all-gathered 16-bit parameters, the gathered fp32 master weights, AdamW's
//    moments and step counts. Buckets whose lengths do not divide by N (one per parameter, and
//    a 1-element bias), clipping off and active;
//  - the ledger against the memory calculator's mixed-precision rows (ZeRO-1 and ZeRO-2);
//  - fp16 overflow (ZeRO-1 and ZeRO-2): an inf in one rank's gradient (a huge target on rank N − 1
//  only) makes
//    EVERY rank skip that step: the loss scale halves everywhere, no shard's AdamW step count
//    advances, the parameters and master weights stay as they were; the next step is taken;
//  - --reduce-dtype fp32 (ZeRO-1 and ZeRO-2, bf16 and fp16): the reduce-scatter sums in fp32 and
//    the master weights step from that fp32 sum, as chapter 05 does: every step's loss and the
//    gathered master weights equal chapter 05's DDP with --reduce-dtype fp32 bit for bit
//    (clipping on and off, one bucket per parameter and one for all).
#include <cmath>
#include <cstring>
#include <vector>

#include <catch2/catch.hpp>

#include "chapters/06_zero1/step.hpp"
#include "chapters/07_zero2/step.hpp"
#include "mpi/difference_report.hpp"
#include "mpi/zero_harness.hpp"

using namespace ringzero;
using namespace ringzero::test;

namespace {

struct MixedCase {
  std::vector<int64_t> sizes;
  double bucket_cap_mb;
  float clip;
};

// {sizes, cap, clip}: one bucket per parameter (lengths 35, 7, 21, 3 and 6, 1, 3, 1: none
// divisible by 2, 3 and 4 together; a 1-element bucket), one bucket for all, clipping on/off.
const std::vector<MixedCase> kMixedCases = {{{5, 7, 3}, 1e-6, 0.0f},
                                            {{5, 7, 3}, 25.0, 0.0f},
                                            {{6, 1, 3}, 1e-6, 0.05f},
                                            {{9, 13, 4}, 1e-6, 0.05f}};

// The harness's case for a MixedCase, `steps` optimizer steps.
ZeroCase case_of(const MixedCase& mc, int64_t steps) {
  ZeroCase c;
  c.sizes = mc.sizes;
  c.bucket_cap_mb = mc.bucket_cap_mb;
  c.clip_grad_norm = mc.clip;
  c.steps = steps;
  return c;
}

TrainConfig mixed_config(const ZeroCase& c, Dtype d) {
  TrainConfig config = zero_test_config(c);
  config.precision = dtype_name(d);
  return config;
}

// The serial re-enactment: returns the 16-bit parameters (model layout), the fp32 masters and
// AdamW's moments after `steps` steps.
struct Reference {
  std::vector<uint16_t> params16;
  std::vector<float> master, exp_avg, exp_avg_sq;
  int64_t steps = 0;
};

Reference reenact(const ZeroCase& c, Dtype d, int N, int64_t steps) {
  const TrainConfig config = mixed_config(c, d);
  Model model(c.sizes, /*seed=*/5);
  const int64_t psi = model.num_parameters();
  std::vector<float> master(model.params_memory.span().begin(), model.params_memory.span().end());
  AdamWOptions o;
  o.lr = config.lr;
  o.weight_decay = config.weight_decay;
  AdamW adamw(parameter_sizes(model), o);
  const auto plan =
      plan_buckets(parameter_sizes(model), mib_to_bytes(c.bucket_cap_mb), mib_to_bytes(1.0));
  HalfStorage half(model, d);                        // params16 = round(master): the same start
  float scale = d == Dtype::fp16 ? 65536.0f : 1.0f;  // GradScaler's initial scale
  int64_t taken = 0;
  for (int64_t step = 0; step < steps; ++step) {
    std::vector<std::vector<uint16_t>> local(static_cast<size_t>(N));  // (N, Ψ) 16-bit grads
    for (int q = 0; q < N; ++q) {
      half.zero_grad();
      Tape tape;
      Var loss = forward_loss(tape, model, zero_test_batch(c, q, step, 0));
      tape.backward(loss, 1.0f / static_cast<float>(N) * scale);
      local[q].assign(half.grads16.span().begin(), half.grads16.span().end());
    }
    std::vector<uint16_t> reduced(static_cast<size_t>(psi));
    std::vector<double> rank_sums(static_cast<size_t>(N), 0.0);
    const float inv_scale = static_cast<float>(1.0 / static_cast<double>(scale));
    for (const Bucket& b : plan) {  // plan order
      const int64_t n = b.size, pad = (N - n % N) % N, s = (n + pad) / N;
      for (int ch = 0; ch < N; ++ch) {  // chunk ch = rank ch's shard
        for (int64_t j = ch * s; j < (ch + 1) * s && j < n; ++j) {
          const size_t i = static_cast<size_t>(b.offset + j);
          uint16_t acc = local[(ch + 1) % N][i];
          for (int k = 2; k <= N; ++k)
            acc =
                float_to_half(d, half_to_float(d, acc) + half_to_float(d, local[(ch + k) % N][i]));
          reduced[i] = acc;
        }
      }
    }
    // fp16: GradScaler's rule: any inf/NaN anywhere skips the step and halves the scale.
    if (d == Dtype::fp16 && has_non_finite(d, reduced)) {
      scale *= 0.5f;
      continue;
    }
    // Σg² per shard (sum_of_squares_half: one double sum over the shard's elements, in order),
    // a rank's shards in plan order, then the ranks in rank order.
    for (const Bucket& b : plan) {
      const int64_t n = b.size, pad = (N - n % N) % N, s = (n + pad) / N;
      for (int ch = 0; ch < N; ++ch) {
        const int64_t lo = std::min(n, ch * s), hi = std::min(n, (ch + 1) * s);
        rank_sums[ch] += sum_of_squares_half(
            d,
            std::span<const uint16_t>(reduced).subspan(static_cast<size_t>(b.offset + lo),
                                                       static_cast<size_t>(hi - lo)),
            inv_scale);
      }
    }
    float factor = inv_scale;
    if (c.clip_grad_norm > 0) {
      double total = 0;
      for (double v : rank_sums) total += v;
      factor *= clip_coefficient(std::sqrt(total), c.clip_grad_norm);
    }
    std::vector<float> g(static_cast<size_t>(psi));
    for (size_t i = 0; i < g.size(); ++i) {
      g[i] = half_to_float(d, reduced[i]);
      if (factor != 1.0f) g[i] *= factor;
    }
    adamw.step(master, g);
    convert_to_half(d, master, half.params16.span());
    ++taken;
  }
  Reference r;
  r.params16.assign(half.params16.span().begin(), half.params16.span().end());
  r.master = master;
  r.exp_avg.assign(adamw.exp_avg().begin(), adamw.exp_avg().end());
  r.exp_avg_sq.assign(adamw.exp_avg_sq().begin(), adamw.exp_avg_sq().end());
  r.steps = taken;
  return r;
}

// Concatenates the named tensors "<param><suffix>" in registration order.
std::vector<float> flat(const std::map<std::string, NamedTensor>& m, const Model& model,
                        const std::string& suffix) {
  std::vector<float> out;
  for (const Parameter* p : model.parameters()) {
    const NamedTensor& t = m.at(p->name() + suffix);
    out.insert(out.end(), t.values.begin(), t.values.end());
  }
  return out;
}

int64_t bits_differ16(const std::vector<uint16_t>& a, const std::vector<uint16_t>& b) {
  if (a.size() != b.size()) return -1;
  int64_t n = 0;
  for (size_t i = 0; i < a.size(); ++i) n += a[i] != b[i];
  return n;
}

// The lesson's 16-bit parameters in the model's unpadded layout.
template <class L>
std::vector<uint16_t> unpadded_params16(L& lesson, const Model& model) {
  std::vector<uint16_t> out;
  const auto p16 = as_bits(lesson.engine.parameter_storage());
  for (size_t i = 0; i < model.parameters().size(); ++i) {
    const auto at = static_cast<size_t>(lesson.engine.layout().param_offset[i]);
    out.insert(out.end(), p16.begin() + at, p16.begin() + at + model.parameters()[i]->numel());
  }
  return out;
}

template <class L>
void require_equal_to_reenactment_in(Dtype d) {
  Communicator& comm = test_comm();
  const int N = comm.world_size();
  for (const MixedCase& mc : kMixedCases) {
    const ZeroCase c = case_of(mc, 2);
    INFO(dtype_name(d) << ", sizes[1] = " << c.sizes[1] << ", cap " << c.bucket_cap_mb << ", clip "
                       << c.clip_grad_norm << ", N = " << N << ", rank " << comm.rank());
    const Reference ref = reenact(c, d, N, c.steps);
    const TrainConfig config = mixed_config(c, d);
    Model model(c.sizes, /*seed=*/5);
    Tracer tracer;
    SetUp setup{&comm, model, config, tracer};
    ZeroBucketFlags flags;
    flags.options.bucket_cap_mb = c.bucket_cap_mb;
    L lesson(setup, flags);
    RunResult out;
    run_steps(c, model, config, lesson, out);
    REQUIRE(out.nonzero_padding == 0);
    REQUIRE(bits_differ16(unpadded_params16(lesson, model), ref.params16) == 0);
    REQUIRE_SAME_BITS("the fp32 master weights after the steps (expected: the serial re-enactment)",
                      ref.master, flat(lesson.model_state_dict(model), model, ""),
                      parameter_element(model));
    const auto opt = *lesson.saved_optimizer_state();
    REQUIRE_SAME_BITS("AdamW's exp_avg (expected: the serial re-enactment)", ref.exp_avg,
                      flat(opt, model, ".exp_avg"), parameter_element(model));
    REQUIRE_SAME_BITS("AdamW's exp_avg_sq (expected: the serial re-enactment)", ref.exp_avg_sq,
                      flat(opt, model, ".exp_avg_sq"), parameter_element(model));
    for (float t : flat(opt, model, ".step")) REQUIRE(t == static_cast<float>(ref.steps));
  }
}

template <template <class, class> class Lesson>
void require_equal_to_reenactment() {
  for (Dtype d : {Dtype::bf16, Dtype::fp16}) {
    if (d == Dtype::bf16)
      require_equal_to_reenactment_in<Lesson<bf16, bf16>>(d);
    else
      require_equal_to_reenactment_in<Lesson<fp16, fp16>>(d);
  }
}

}  // namespace

TEST_CASE("ZeRO-1 in 16 bits: two steps equal the serial re-enactment bit for bit",
          "[zero][mixed][zero1_16bit]") {
  require_equal_to_reenactment<Zero1Training>();
}

TEST_CASE("ZeRO-2 in 16 bits: two steps equal the serial re-enactment bit for bit",
          "[zero][mixed][zero2_16bit]") {
  require_equal_to_reenactment<Zero2Training>();
}

namespace {

template <template <class, class> class Lesson>
void require_overflow_skipped_everywhere() {
  using L = Lesson<fp16, fp16>;
  Communicator& comm = test_comm();
  const int N = comm.world_size(), rank = comm.rank();
  ZeroCase c;
  c.sizes = {9, 13, 4};
  c.bucket_cap_mb = 1e-6;  // one bucket per parameter: the inf reaches only some shards
  const TrainConfig config = mixed_config(c, Dtype::fp16);
  Model model(c.sizes, /*seed=*/5);
  Tracer tracer;
  SetUp setup{&comm, model, config, tracer};
  ZeroBucketFlags flags;
  flags.options.bucket_cap_mb = c.bucket_cap_mb;
  L lesson(setup, flags);
  auto steps_of = [&] { return flat(*lesson.saved_optimizer_state(), model, ".step"); };
  auto batch = [&](int64_t step, bool overflow) {
    return [&, step, overflow](int64_t k) {
      Batch b = zero_test_batch(c, rank, step, k);
      for (float& v : b.x.span()) v *= 0.1f;  // small: no overflow at the initial scale 2^16
      for (float& v : b.y.span()) v *= 0.1f;
      // A target of 1e4 on the last rank: dloss/dout ≈ 2·1e4/12 · 2^16/N > 65504, inf in fp16.
      if (overflow && rank == N - 1) b.y.data()[0] = 1e4f;
      return b;
    };
  };
  const int64_t K = config.grad_accum_steps;
  train_step(lesson.engine, Step{model, K, 1, batch(0, false)});
  REQUIRE(lesson.engine.optimizer().loss_scale() == 65536.0f);
  const std::vector<uint16_t> params_after_1 = unpadded_params16(lesson, model);
  const std::vector<float> master_after_1 = flat(lesson.model_state_dict(model), model, "");
  for (float t : steps_of()) REQUIRE(t == 1.0f);

  train_step(lesson.engine, Step{model, K, 2, batch(1, true)});  // overflow on rank N − 1
  INFO("N = " << N << ", rank " << rank);
  REQUIRE(lesson.engine.optimizer().loss_scale() == 32768.0f);  // halved on every rank
  REQUIRE(lesson.engine.optimizer().summary()["skipped_steps"] == 1);
  for (float t : steps_of()) REQUIRE(t == 1.0f);  // no shard's step count advanced
  REQUIRE(bits_differ16(unpadded_params16(lesson, model), params_after_1) == 0);
  REQUIRE_SAME_BITS("the master weights after the skipped step (expected: as after step 1)",
                    master_after_1, flat(lesson.model_state_dict(model), model, ""),
                    parameter_element(model));

  train_step(lesson.engine, Step{model, K, 3, batch(2, false)});  // taken again
  REQUIRE(lesson.engine.optimizer().loss_scale() == 32768.0f);
  for (float t : steps_of()) REQUIRE(t == 2.0f);
  REQUIRE(bits_differ16(unpadded_params16(lesson, model), params_after_1) > 0);
}

}  // namespace

TEST_CASE("ZeRO-1 in fp16: an overflow on one rank skips the step on every rank",
          "[zero][mixed][zero1_16bit]") {
  require_overflow_skipped_everywhere<Zero1Training>();
}

TEST_CASE("ZeRO-2 in fp16: an overflow on one rank skips the step on every rank",
          "[zero][mixed][zero2_16bit]") {
  require_overflow_skipped_everywhere<Zero2Training>();
}

namespace {

// The ledger of a ZeRO engine built in 16 bits, against the memory calculator's mixed-precision
// row (zero_model_state_bytes with kMixedPrecisionAdam, what --memory-calculator
// --mixed-precision prints) at this Ψ and N: {6, 6, 6} is one bucket of Ψ = 84 elements,
// divisible by 1..4, so no padding and every rank's shard is exactly Ψ/N. Then a model with
// padding: the formula plus the stated padding (2 bytes per padding element of the parameters
// and of the gradients, counted under padding) and 12 bytes per real shard element.
template <template <class, class> class Lesson>
void require_ledger_equals_calculator(int zero_stage) {
  using L = Lesson<bf16, bf16>;
  Communicator& comm = test_comm();
  const int N = comm.world_size();
  for (const auto& [sizes, cap] :
       std::vector<std::pair<std::vector<int64_t>, double>>{{{6, 6, 6}, 25.0}, {{5, 7, 3}, 1e-6}}) {
    const Ledger& ledger = Ledger::get();
    const int64_t params0 = ledger.current(MemTag::parameters),
                  grads0 = ledger.current(MemTag::gradients),
                  opt0 = ledger.current(MemTag::optimizer_state),
                  pad0 = ledger.current(MemTag::padding);
    ZeroCase c;
    c.sizes = sizes;
    c.bucket_cap_mb = cap;
    const TrainConfig config = mixed_config(c, Dtype::bf16);
    Model model(c.sizes, /*seed=*/5);
    Tracer tracer;
    SetUp setup{&comm, model, config, tracer};
    ZeroBucketFlags flags;
    flags.options.bucket_cap_mb = cap;
    L lesson(setup, flags);
    const ShardLayout& layout = lesson.engine.layout();
    const int64_t psi = model.num_parameters();
    const ModelStateBytes row =
        zero_model_state_bytes(zero_stage, static_cast<double>(psi), N, kMixedPrecisionAdam);
    INFO("Ψ = " << psi << ", N = " << N << ", padding " << layout.padding_total);
    const int64_t params = ledger.current(MemTag::parameters) - params0,
                  grads = ledger.current(MemTag::gradients) - grads0,
                  opt = ledger.current(MemTag::optimizer_state) - opt0,
                  pad = ledger.current(MemTag::padding) - pad0;
    REQUIRE(params == 2 * psi);
    REQUIRE(opt == 12 * layout.shard_real);
    if (zero_stage == 1) {
      REQUIRE(grads == 2 * psi);
      REQUIRE(pad == 4 * layout.padding_total);
    } else {  // the gradient shard; its padding is the shard's elements past the real ones
      REQUIRE(grads == 2 * layout.shard_real);
      REQUIRE(pad == 2 * layout.padding_total + 2 * (layout.shard_total - layout.shard_real));
    }
    REQUIRE(params + grads + opt + pad == lesson.engine.model_states_bytes()[comm.rank()]);
    if (layout.padding_total == 0) {  // the calculator's row, to the byte
      REQUIRE(static_cast<double>(params) == row.parameters);
      REQUIRE(static_cast<double>(grads) == row.gradients);
      REQUIRE(static_cast<double>(opt) == row.optimizer_state);
    }
  }
}

}  // namespace

TEST_CASE("ZeRO-1 in bf16: the ledger equals the calculator's mixed-precision row",
          "[zero][mixed][zero1_16bit]") {
  require_ledger_equals_calculator<Zero1Training>(1);
}

TEST_CASE("ZeRO-2 in bf16: the ledger equals the calculator's mixed-precision row",
          "[zero][mixed][zero2_16bit]") {
  require_ledger_equals_calculator<Zero2Training>(2);
}

namespace {

// --reduce-dtype fp32 in 16 bits: ZeRO-`stage`'s lesson L against chapter 05's DDP, which
// steps its master weights from the fp32 all-reduce. Every step's loss and the master weights
// after it are compared bit for bit.
template <template <class, class> class Lesson>
void require_fp32_reduce_equal_to_ddp() {
  Communicator& comm = test_comm();
  for (Dtype d : {Dtype::bf16, Dtype::fp16}) {
    for (const MixedCase& mc : kMixedCases) {
      const ZeroCase c = case_of(mc, 3);
      TrainConfig config = mixed_config(c, d);
      config.reduce_dtype = "fp32";
      INFO(dtype_name(d) << ", sizes[1] = " << c.sizes[1] << ", cap " << c.bucket_cap_mb
                         << ", clip " << c.clip_grad_norm << ", N = " << comm.world_size());
      auto run = [&](auto& lesson, Model& model) {
        RunResult out;
        run_steps(c, model, config, lesson, out);
        return std::pair(out.losses, flat(lesson.model_state_dict(model), model, ""));
      };
      Model ddp_model(c.sizes, /*seed=*/5), zero_model(c.sizes, /*seed=*/5);
      Tracer tracer;
      SetUp ddp_setup{&comm, ddp_model, config, tracer},
          zero_setup{&comm, zero_model, config, tracer};
      DDPFlags ddp_flags;
      ddp_flags.options.bucket_cap_mb = c.bucket_cap_mb;
      DDPTraining ddp(ddp_setup, ddp_flags);
      const auto [ddp_losses, ddp_master] = run(ddp, ddp_model);
      ZeroBucketFlags zero_flags;
      zero_flags.options.bucket_cap_mb = c.bucket_cap_mb;
      if (d == Dtype::bf16) {
        Lesson<bf16, float> zero(zero_setup, zero_flags);
        const auto [losses, master] = run(zero, zero_model);
        REQUIRE_SAME_BITS("every step's loss (expected: chapter 05's)", ddp_losses, losses, {});
        REQUIRE_SAME_BITS("the master weights (expected: chapter 05's)", ddp_master, master,
                          parameter_element(zero_model));
      } else {
        Lesson<fp16, float> zero(zero_setup, zero_flags);
        const auto [losses, master] = run(zero, zero_model);
        REQUIRE_SAME_BITS("every step's loss (expected: chapter 05's)", ddp_losses, losses, {});
        REQUIRE_SAME_BITS("the master weights (expected: chapter 05's)", ddp_master, master,
                          parameter_element(zero_model));
      }
    }
  }
}

}  // namespace

TEST_CASE("ZeRO-1 with --reduce-dtype fp32 equals chapter 05's DDP bit for bit",
          "[zero][mixed][zero1_16bit]") {
  require_fp32_reduce_equal_to_ddp<Zero1Training>();
}

TEST_CASE("ZeRO-2 with --reduce-dtype fp32 equals chapter 05's DDP bit for bit",
          "[zero][mixed][zero2_16bit]") {
  require_fp32_reduce_equal_to_ddp<Zero2Training>();
}
