#include "common/core/step.hpp"

#include <cmath>

#include "common/core/check.hpp"
#include "common/core/ops.hpp"
#include "common/core/step_time.hpp"

namespace ringzero {

Var forward_loss(Tape& tape, Model& model, const Batch& batch, Var* output) {
  const PartScope part(StepPart::forward);  // --attribute
  // The batch is read on the host; the model may live on a device (a no-op copy on the host).
  Var out = model.forward(tape, make_var(batch.x.to(model.device(), MemTag::activations)));
  if (output != nullptr) *output = out;
  return batch.labels.empty()
             ? mse_loss(tape, out, batch.y.to(model.device(), MemTag::activations))
             : cross_entropy(tape, out, batch.labels);
}

void check_finite_loss(double loss, int64_t step) {
  RZ_CHECK(std::isfinite(loss),
           "loss is " << loss << " at step " << step
                      << "; training diverged: lower --lr or set --clip-grad-norm (e.g. 1.0)");
}

}  // namespace ringzero
