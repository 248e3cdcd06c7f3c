// device_train: the training step of chapters 01-02 on a GPU (--device cuda).
//
// Provides: DeviceTrainer, which holds the model's flat parameters and gradients, the optimizer
// state and the activations in GPU memory (DeviceBuffer, counted in the ledger's device column)
// and runs the same step as the CPU: forward through Linear/ReLU layers, the loss (cross-entropy
// or MSE), backward ACCUMULATING into the flat gradient buffer, global-norm clipping, and AdamW
// or SGD. Every element-wise op is the shared function of common/kernels.hpp; the matrix products
// are cuBLAS SGEMM with TF32 off (common/gpu/device.hpp). The CPU Model stays the source of the
// initial weights and of evaluation: copy_params_to_host() writes the trained weights back into
// model.params_memory, so evaluate() and --save-final run the CPU code on the GPU's weights.
// Differences from the CPU run: float32 rounding only (cuBLAS sums the products in another order
// than Eigen; FMA contraction; float64 exp/log in the last bit), measured by scripts/gpu-check.
// Leaves out: the autograd tape on the GPU (the layer loop is written out; the tape and its hooks
// stay the CPU's), evaluation on the GPU, the distributed chapters (03-08) on the GPU.
// Built only with -DRINGZERO_CUDA=ON; without it make_device_trainer() fails with the fix.
#pragma once

#include <memory>

#include "config.hpp"
#include "nn.hpp"
#include "train.hpp"

namespace ringzero {

class DeviceTrainer {
 public:
  virtual ~DeviceTrainer() = default;
  /// Gradients to zero (PyTorch zero_grad(set_to_none=False)).
  virtual void zero_grad() = 0;
  /// Forward and backward of one (micro-)batch with d loss = dloss (1/K under accumulation):
  /// gradients +=. Returns the batch's mean loss (as the CPU's loss->value[0]). Synchronises.
  virtual double forward_backward(const Batch& batch, float dloss) = 0;
  /// clip_grad_norm_ over the whole gradient; returns the norm before clipping.
  virtual double clip_grad_norm(float max_norm) = 0;
  /// One optimizer step (--optimizer adamw|sgd with the run's hyperparameters).
  virtual void step() = 0;
  /// The trained parameters (and gradients) into model.params_memory (grads_memory).
  virtual void copy_to_host(Model& model) = 0;
  /// The GPU's name, e.g. "NVIDIA H200".
  virtual const std::string& device_name() const = 0;
};

/// Copies the model's parameters to GPU `device` (0 in chapters 01-02) and allocates the
/// gradients and optimizer state there. Errors: no CUDA in this build (reconfigure with
/// -DRINGZERO_CUDA=ON), no GPU visible (use --device cpu).
std::unique_ptr<DeviceTrainer> make_device_trainer(const Model& model, const TrainConfig& config,
                                                   int device = 0);

}  // namespace ringzero
