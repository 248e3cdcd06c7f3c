// step: what one optimizer step reads and the calls every chapter's train_step makes, with
// nothing of the run around it.
//
// Provides: Batch (one micro-batch), Step (the inputs of one train_step), forward_loss (forward
// and the loss on a tape), check_finite_loss (the NaN guard) and Precision, what a step asks of
// the optimizer in the run's number format (zero_grad, backward's seed, the update).
// Leaves out: where the batches come from (common/data/, common/driver/train.hpp), the loop
// around the step (common/driver/run.hpp) and the precisions themselves (common/precision/:
// fp32, and bf16/fp16 with fp32 master weights and fp16's loss scale).
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "common/core/autograd.hpp"
#include "common/core/nn.hpp"
#include "common/core/tensor.hpp"

namespace ringzero {

/// One (micro-)batch copied out of a dataset (make_batch, common/driver/train.hpp).
struct Batch {
  Tensor x;                     ///< (n, in_features)
  Tensor y;                     ///< (n, out_features), regression only
  std::vector<int32_t> labels;  ///< (n), classification only
};

/// The inputs of one optimizer step besides the lesson object: what train_step reads.
struct Step {
  Model& model;
  int64_t grad_accum_steps;  ///< K, micro-batches per optimizer step (--grad-accum-steps)
  int64_t step;              ///< 1-based optimizer step of the run (the NaN guard names it)
  /// This rank's micro-batch k (0 <= k < K) of the step's global batch: (B/(N K), in).
  std::function<Batch(int64_t micro_step)> micro_batch;
};

/// Forward pass and the loss of the model (cross-entropy for classification, MSE for
/// regression), mean over the batch, recorded on `tape`; `output` (if given) gets the model's
/// output (B, out). The batch is copied to the model's device first (Model::to); the loss is a
/// host scalar.
Var forward_loss(Tape& tape, Model& model, const Batch& batch, Var* output = nullptr);

/// Stops the run at the first non-finite loss, naming the step and the usual fixes.
void check_finite_loss(double loss, int64_t step);

/// What a training step asks of the optimizer in the run's number format, as nanoGPT's loop asks
/// its optimizer and GradScaler (a no-op when disabled): the same calls in fp32, bf16 and fp16.
/// ReplicatedPrecision (common/precision/precision.hpp) implements it: in fp32 the model's own
/// gradients and --optimizer; in 16 bits MixedPrecision's 16-bit gradients, fp32 master weights
/// and AdamW moments, and in fp16 the loss scale (Micikevicius et al. 2018, §3).
class Precision {
 public:
  virtual ~Precision() = default;
  /// Sets every gradient to zero: backward adds (+=) into them.
  virtual void zero_grad() = 0;
  /// Backward's seed for the mean of K micro-batch means: 1/K in fp32; in 16 bits
  /// loss_scale/(N·K), pre-divided by the N ranks whose gradients are summed (1 on one process).
  virtual float seed(int64_t grad_accum_steps) const = 0;
  /// The factor backward's seed carries: the GradScaler's scale in fp16, else exactly 1.
  virtual float loss_scale() const = 0;
  /// fp16: stops, naming the fix, when the loss at step 1 (before any update) is not finite:
  /// the forward overflowed fp16's range. Does nothing otherwise.
  virtual void check_first_loss(double loss, int64_t step) const = 0;
  /// The optimizer's update from the gradients, after --clip-grad-norm; fp16 skips a step whose
  /// gradients overflowed. Returns whether it stepped.
  virtual bool step() = 0;
};

}  // namespace ringzero
