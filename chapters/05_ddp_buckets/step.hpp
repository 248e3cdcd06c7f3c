// Chapter 05's step: training with DDP (ddp.hpp), gradients all-reduced bucket by bucket.
//
// Provides: train_step() over the engine, and the lesson the driver runs: the engine and its
// description (common/driver/engine_lesson.hpp).
// Leaves out: the buckets, their readiness and collectives (ddp.hpp, buckets.hpp, readiness.hpp).
#pragma once

#include "chapters/05_ddp_buckets/ddp.hpp"
#include "common/driver/dist_eval.hpp"
#include "common/driver/engine_lesson.hpp"
#include "common/driver/lesson.hpp"
#include "common/driver/train.hpp"

namespace ringzero {

/// One optimizer step on the global batch: K micro-steps on this rank's share, the last one's
/// backward all-reducing bucket after bucket, and the same optimizer step on every rank.
/// Returns the global batch's mean loss (on every rank). Errors: a non-finite loss stops every
/// rank; a parameter without gradient (the engine's finalize_backward).
inline double train_step(DDP& engine, const Step& step) {
  const int64_t K = step.grad_accum_steps;
  engine.zero_grad();
  double loss_sum = 0;
  for (int64_t micro_step = 0; micro_step < K; ++micro_step) {
    Batch batch = step.micro_batch(micro_step);    // (B/(N K), in)
    engine.set_require_sync(micro_step == K - 1);  // only the last backward sends
    Tape tape;
    Var loss = forward_loss(tape, step.model, batch);  // mean over this micro-batch
    loss_sum += loss->value[0];
    tape.backward(loss, engine.optimizer().seed(K));  // grads += dloss/K; full buckets start
  }
  engine.finalize_backward();  // every bucket all-reduced, the mean; MPI is ours again
  const double loss_value = global_mean(engine.comm(), loss_sum / K);  // equal shares
  engine.optimizer().check_first_loss(loss_value, step.step);          // fp16: forward overflow?
  // Every rank stops together; the error names the rank(s) whose loss is not finite.
  check_finite_loss(engine.comm(), loss_sum / K, loss_value, step.step);

  engine.step();  // the same step everywhere (--clip-grad-norm first)
  return loss_value;
}

/// Chapter 05's lesson: the DDP engine, which holds every rank's optimizer (replicated state, as
/// chapter 04) and all-reduces the gradients bucket by bucket during backward; its flags are
/// DDPFlags (options.hpp).
using DDPTraining = EngineLesson<DDP>;

}  // namespace ringzero
