// Chapter 06's step: training with ZeRO-1 (zero.hpp), optimizer state sharded over ranks.
//
// Provides: train_step() over the engine, and the lesson the driver runs: the engine and its
// description (common/driver/engine_lesson.hpp).
// Leaves out: the buckets, their shards and collectives (zero.hpp, shard.hpp).
#pragma once

#include "chapters/06_zero1/zero.hpp"
#include "common/driver/dist_eval.hpp"
#include "common/driver/engine_lesson.hpp"
#include "common/driver/lesson.hpp"
#include "common/driver/train.hpp"

namespace ringzero {

/// One optimizer step on the global batch: K micro-steps on this rank's share, the last one's
/// backward reduce-scattering buckets, each rank's step on its shard, the parameters' all-gather.
/// Returns the global batch's mean loss (on every rank). Errors: a non-finite loss stops every
/// rank; a parameter without gradient (the engine's finalize_backward).
template <class T, class R>  // the element types --precision and --reduce-dtype pick
double train_step(Zero1<T, R>& engine, const Step& step) {
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
  engine.finalize_backward();  // every bucket reduce-scattered: this rank's shard holds the mean
  const double loss_value = global_mean(engine.comm(), loss_sum / K);  // equal shares
  engine.optimizer().check_first_loss(loss_value, step.step);          // fp16: forward overflow?
  // Every rank stops together; the error names the rank(s) whose loss is not finite.
  check_finite_loss(engine.comm(), loss_sum / K, loss_value, step.step);

  engine.step();  // each rank updates its shard (--clip-grad-norm first), then gathers every shard
  return loss_value;
}

/// Chapter 06's lesson: the ZeRO-1 engine (it owns the parameters, the gradients and this rank's
/// optimizer shard) over element types T and R; its flags are ZeroBucketFlags (zero.hpp).
template <class T = float, class R = T>
using Zero1Training = EngineLesson<Zero1<T, R>>;

}  // namespace ringzero
