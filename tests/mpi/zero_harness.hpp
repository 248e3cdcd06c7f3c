// Shared by tests/mpi/zero1.cpp and zero2.cpp: small training runs of chapter 05's DDP (the
// reference) and of a chapter's ZeRO lesson on the same model, data and flags, on every rank,
// each step the chapter's own train_step, returning what the equivalence tests compare: final
// parameters, every step's loss and AdamW's state (exp_avg, exp_avg_sq, step per parameter) in
// the unpadded layout. Self-contained: includes what it uses, in any order.
#pragma once

#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "chapters/05_ddp_buckets/step.hpp"
#include "common/core/rng.hpp"
#include "common/driver/train.hpp"
#include "common/io/safetensors.hpp"
#include "common/zero/shard_state.hpp"  // nonzero_padding
#include "mpi/test_comm.hpp"

namespace ringzero::test {

struct ZeroCase {
  std::vector<int64_t> sizes;   // model layer sizes {in, hidden..., out}
  double bucket_cap_mb = 25.0;  // small: one bucket per parameter
  int64_t steps = 3;
  int64_t grad_accum_steps = 1;  // K
  float clip_grad_norm = 0.0f;
  int64_t micro_batch = 3;
};

struct RunResult {
  std::vector<float> params;                     // (Ψ) registration order
  std::vector<float> losses;                     // every step's global-batch mean loss
  std::vector<std::vector<float>> step_params;   // (steps) the parameters after each step
  std::map<std::string, NamedTensor> optimizer;  // "<param>.exp_avg" / ".exp_avg_sq" / ".step"
  int64_t nonzero_padding = 0;                   // ZeRO only
};

inline TrainConfig zero_test_config(const ZeroCase& c) {
  TrainConfig config;
  config.optimizer = "adamw";
  config.lr = 1e-2f;  // large enough that every step moves every weight
  config.weight_decay = 0.1f;
  config.clip_grad_norm = c.clip_grad_norm;
  config.grad_accum_steps = c.grad_accum_steps;
  return config;
}

// Rank r's regression micro-batch at (step, micro_step): different on every rank.
inline Batch zero_test_batch(const ZeroCase& c, int rank, int64_t step, int64_t micro_step) {
  Batch b;
  b.x = Tensor::zeros({c.micro_batch, c.sizes.front()}, MemTag::activations);
  b.y = Tensor::zeros({c.micro_batch, c.sizes.back()}, MemTag::activations);
  Rng rng(7, static_cast<uint64_t>(10000 * step + 100 * micro_step + rank));
  for (float& v : b.x.span()) v = rng.normal();
  for (float& v : b.y.span()) v = rng.normal();
  return b;
}

inline std::vector<float> model_params(const Model& model) {
  std::vector<float> out;
  for (const Parameter* p : model.parameters())
    out.insert(out.end(), p->data.span().begin(), p->data.span().end());
  return out;
}

// Forward and backward of every micro-step of one optimizer step, the last one synchronised.
template <class Wrapper>
void zero_test_backward(const ZeroCase& c, Model& model, Wrapper& wrapper, int rank, int64_t step,
                        RunResult& out) {
  for (int64_t k = 0; k < c.grad_accum_steps; ++k) {
    auto backward = [&] {
      Batch batch = zero_test_batch(c, rank, step, k);
      Tape tape;
      Var loss = forward_loss(tape, model, batch);
      out.losses.push_back(loss->value[0]);
      tape.backward(loss, 1.0f / static_cast<float>(c.grad_accum_steps));
    };
    wrapper.set_require_sync(k + 1 == c.grad_accum_steps);  // only the last backward sends
    backward();
  }
  wrapper.finalize_backward();
}

// `steps` optimizer steps of lesson L (built as the chapter builds it) with the chapter's own
// train_step, rank r's micro-batch k of step t being zero_test_batch(c, r, t, k).
template <class L>
void run_steps(const ZeroCase& c, Model& model, const TrainConfig& config, L& lesson,
               RunResult& out) {
  const int rank = test_comm().rank();
  for (int64_t step = 0; step < c.steps; ++step) {
    out.losses.push_back(static_cast<float>(train_step(
        lesson.engine, Step{model, config.grad_accum_steps, step + 1,
                            [&](int64_t k) { return zero_test_batch(c, rank, step, k); }})));
    out.step_params.push_back(model_params(model));
    if constexpr (ShardedEngine<decltype(lesson.engine)>)  // common/zero/shard_state.hpp
      out.nonzero_padding += nonzero_padding(lesson.engine);
  }
}

/// The reference: chapter 05's DDPTraining (DDP and one optimizer over every parameter).
inline RunResult run_ddp_reference(const ZeroCase& c) {
  const TrainConfig config = zero_test_config(c);
  Model model(c.sizes, /*seed=*/5);
  Tracer tracer;
  SetUp setup{&test_comm(), model, config, tracer};
  DDPFlags flags;
  flags.options.bucket_cap_mb = c.bucket_cap_mb;
  DDPTraining lesson(setup, flags);
  RunResult out;
  run_steps(c, model, config, lesson, out);
  out.params = model_params(model);
  const AdamW& adamw = *lesson.engine.optimizer().optimizer().adamw();
  for (size_t i = 0; i < model.parameters().size(); ++i) {
    const Parameter& p = *model.parameters()[i];
    const int64_t off = model.offsets()[i];
    out.optimizer[p.name() + ".exp_avg"] = {
        p.shape(), {adamw.exp_avg().begin() + off, adamw.exp_avg().begin() + off + p.numel()}};
    out.optimizer[p.name() + ".exp_avg_sq"] = {
        p.shape(),
        {adamw.exp_avg_sq().begin() + off, adamw.exp_avg_sq().begin() + off + p.numel()}};
    out.optimizer[p.name() + ".step"] = {{1}, {static_cast<float>(adamw.segment_steps()[i])}};
  }
  return out;
}

/// The same run with a chapter's ZeRO lesson (Zero1Training, Zero2Training).
template <class L>
RunResult run_zero(const ZeroCase& c) {
  const TrainConfig config = zero_test_config(c);
  Model model(c.sizes, /*seed=*/5);
  Tracer tracer;
  SetUp setup{&test_comm(), model, config, tracer};
  ZeroBucketFlags flags;  // chapters 06-07's (06's zero.hpp)
  flags.options.bucket_cap_mb = c.bucket_cap_mb;
  L lesson(setup, flags);
  RunResult out;
  run_steps(c, model, config, lesson, out);
  out.params = model_params(model);
  out.optimizer = *lesson.saved_optimizer_state();
  return out;
}

/// Number of elements whose bits differ (sizes must match).
inline int64_t bit_differences(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return -1;
  int64_t n = 0;
  for (size_t i = 0; i < a.size(); ++i) n += std::memcmp(&a[i], &b[i], sizeof(float)) != 0;
  return n;
}

}  // namespace ringzero::test
