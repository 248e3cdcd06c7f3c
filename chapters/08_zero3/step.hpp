// Chapter 08's step: training with ZeRO-3 (zero3.hpp), parameters sharded over ranks too.
//
// Provides: train_step() over the engine, and the lesson the driver runs: the engine and its
// description (common/driver/engine_lesson.hpp).
// Leaves out: the layer shards and their collectives (zero3.hpp, layer_shard.hpp).
#pragma once

#include "chapters/08_zero3/zero3.hpp"
#include "common/driver/dist_eval.hpp"
#include "common/driver/engine_lesson.hpp"
#include "common/driver/lesson.hpp"
#include "common/driver/train.hpp"

namespace ringzero {

/// One optimizer step on the global batch: K micro-steps on this rank's share, each gathering
/// every layer twice and reduce-scattering its gradient, then each rank's step on its shard.
/// Returns the global batch's mean loss (on every rank). Errors: a non-finite loss stops every
/// rank; ranks whose collectives differ (the desync check); a layer without a backward.
template <class T, class R>  // the element types --precision and --reduce-dtype pick
double train_step(Zero3<T, R>& engine, const Step& step) {
  const int64_t K = step.grad_accum_steps;
  engine.zero_grad();
  double loss_sum = 0;
  for (int64_t micro_step = 0; micro_step < K; ++micro_step) {
    Batch batch = step.micro_batch(micro_step);  // (B/(N K), in)
    Tape tape;
    Var loss = forward_loss(tape, step.model, batch);  // mean over this micro-batch; gathers
    loss_sum += loss->value[0];
    tape.backward(loss, engine.optimizer().seed(K));  // gathers again; each gradient shard += mean
  }
  engine.finalize_backward();  // nothing in flight, no layer gathered: only the shards
  const double loss_value = global_mean(engine.comm(), loss_sum / K);  // equal shares
  engine.optimizer().check_first_loss(loss_value, step.step);          // fp16: forward overflow?
  // Every rank stops together; the error names the rank(s) whose loss is not finite.
  check_finite_loss(engine.comm(), loss_sum / K, loss_value, step.step);

  engine.step();  // each rank updates its shard (--clip-grad-norm first); the next forward gathers
  return loss_value;
}

/// Chapter 08's lesson: the ZeRO-3 engine, which owns this rank's shards of the parameters, the
/// gradients and the optimizer state, over element types T and R; its flags are Zero3Flags
/// (options.hpp).
template <class T = float, class R = T>
using Zero3Training = EngineLesson<Zero3<T, R>>;

}  // namespace ringzero
