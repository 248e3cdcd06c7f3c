// device_train: the training step on a GPU (--device cuda): one process (chapters 01-02) and the
// local part of every distributed chapter (03-08, common/gpu/device_parallel.cpp).
//
// Provides: DeviceTrainer, which holds the model's flat parameters and gradients, the optimizer
// state and the activations in GPU memory (DeviceBuffer, counted in the ledger's device column)
// and runs the same step as the CPU: forward through Linear/ReLU layers, the loss (cross-entropy
// or MSE), backward ACCUMULATING into the flat gradient buffer, global-norm clipping, and AdamW
// or SGD. Every element-wise op is the shared function of common/kernels.hpp; the matrix products
// are cuBLAS SGEMM with TF32 off (common/gpu/device.hpp). The CPU Model stays the source of the
// initial weights and of evaluation: copy_to_host() writes the trained weights back into
// model.params_memory, so evaluate() and --save-final run the CPU code on the GPU's weights.
// DeviceLayerHooks let a distributed step decide, per layer, where the weights are read from and
// where the gradients go, and act when a layer's gradients are written: DDP's buckets, ZeRO-2's
// per-bucket gradients and ZeRO-3's gathered layers (DeviceTrainerOptions drops the flat buffers
// it does not need). DeviceParallel is the distributed chapters' step on top of it.
// Differences from the CPU run: float32 rounding only (cuBLAS sums the products in another order
// than Eigen; FMA contraction; float64 exp/log in the last bit), measured by scripts/gpu-check.
// Leaves out: the autograd tape on the GPU (the layer loop is written out; the tape and its hooks
// stay the CPU's), evaluation on the GPU, 16-bit training on the GPU.
// Built only with -DRINGZERO_CUDA=ON (or the CPU emulation of tests/emul); without it
// make_device_trainer() and make_device_parallel() fail with the fix.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "config.hpp"
#include "nn.hpp"
#include "train.hpp"

namespace ringzero {

class Communicator;
struct Step;
struct TrainingState;

/// Per-layer decisions of a distributed step (layer l = the model's l-th Linear; its weight is
/// (OC, C) and its bias (OC)). Every pointer is a device pointer; null keeps the trainer's own.
class DeviceLayerHooks {
 public:
  virtual ~DeviceLayerHooks() = default;
  /// Before layer l's forward (backward = false) or backward (true): where its weight is read
  /// from, followed by its bias (ZeRO-3 gathers the layer here).
  virtual const float* layer_params(int64_t /*l*/, bool /*backward*/) { return nullptr; }
  /// After layer l's forward kernels are queued.
  virtual void after_layer_forward(int64_t /*l*/) {}
  /// Where layer l's weight and bias gradients accumulate (+=) during its backward.
  virtual void layer_grads(int64_t /*l*/, float*& /*dweight*/, float*& /*dbias*/) {}
  /// After layer l's backward kernels are queued (its gradients complete in stream order).
  virtual void after_layer_backward(int64_t /*l*/) {}
};

/// What the trainer allocates. The defaults are chapters 01-02's: flat parameters, gradients and
/// the optimizer's state, in the model's layout.
struct DeviceTrainerOptions {
  /// Each parameter's first element in the flat device buffers (empty: model.offsets()); ZeRO-1/2
  /// put each bucket's padding after it (chapter 06's padded layout).
  std::vector<int64_t> offsets;
  int64_t flat_size = -1;        ///< elements of the flat buffers (-1: Ψ)
  bool flat_params = true;       ///< false: no flat parameters; hooks give each layer's (ZeRO-3)
  bool flat_grads = true;        ///< false: no flat gradients; hooks give each layer's (ZeRO-2/3)
  bool optimizer = true;         ///< false: the caller steps (the distributed chapters)
};

class DeviceTrainer {
 public:
  virtual ~DeviceTrainer() = default;
  /// Gradients to zero (PyTorch zero_grad(set_to_none=False)).
  virtual void zero_grad() = 0;
  /// Forward and backward of one (micro-)batch with d loss = dloss (1/K under accumulation):
  /// gradients +=. Returns the batch's mean loss (as the CPU's loss->value[0]). Synchronises.
  /// hooks (may be null) place each layer's weights and gradients (DeviceLayerHooks).
  virtual double forward_backward(const Batch& batch, float dloss,
                                  DeviceLayerHooks* hooks = nullptr) = 0;
  /// The flat parameter and gradient buffers (device pointers; null when not allocated) and
  /// their length in elements.
  virtual float* params() = 0;
  virtual float* grads() = 0;
  virtual int64_t flat_size() const = 0;
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
/// gradients and optimizer state there (as `options` says). Errors: no CUDA in this build
/// (reconfigure with -DRINGZERO_CUDA=ON), no GPU visible (use --device cpu), a model that is not
/// a Linear/ReLU MLP.
std::unique_ptr<DeviceTrainer> make_device_trainer(const Model& model, const TrainConfig& config,
                                                   int device = 0,
                                                   DeviceTrainerOptions options = {});

/// What a distributed chapter's step does on the GPU; DeviceExtension fills it from the lesson's
/// description() (common/engine_description.hpp; common/device_ext.cpp).
struct DevicePlan {
  enum class Kind {
    central,     ///< 03: gradients summed on rank 0, which steps and broadcasts the parameters
    all_reduce,  ///< 04: every parameter all-reduced after backward, every rank steps
    buckets,     ///< 05: buckets all-reduced as backward completes them
    zero,        ///< 06-08: ZeRO stage 1, 2 or 3
  };
  Kind kind = Kind::all_reduce;
  int zero_stage = 0;  ///< 1, 2, 3 with Kind::zero
  bool ring = true;    ///< chapter 04's ring over sendrecv; false: the transport's collective
  bool nccl_collectives = false;  ///< --collectives nccl: the transport must be NCCL
  bool prefetch = true;  ///< 08: gather the next layer while this one computes (--no-prefetch)
  struct Range {
    int64_t offset = 0;   ///< first element in the model's unpadded layout
    int64_t size = 0;     ///< real elements
    int64_t padding = 0;  ///< zeros after it (ZeRO: to a multiple of world_size)
  };
  /// 05-07: the buckets in the order their collectives are posted (backward: last layers
  /// first), whole parameters each; 08: the layers in forward order (weight, then bias).
  std::vector<Range> ranges;
  std::string transport = "auto";  ///< --gpu-transport: auto | nccl | staged
};

/// A distributed chapter's optimizer step on the GPU (common/gpu/device_parallel.cpp).
class DeviceParallel {
 public:
  virtual ~DeviceParallel() = default;
  /// One optimizer step of the global batch; returns its mean loss, equal on every rank.
  /// Errors: a non-finite loss stops every rank (as the CPU step).
  virtual double train_step(const Step& step) = 0;
  /// The trained parameters into the host buffers the driver and the lesson read: every
  /// Parameter's data where it holds the whole parameter, and each of `state`'s pieces.
  /// Collective.
  virtual void copy_to_host(Model& model, const TrainingState& state) = 0;
  virtual const std::string& device_name() const = 0;
  /// "nccl" or "staged-mpi".
  virtual std::string transport() const = 0;
  /// true where collectives can run on a communication stream beside the compute (NCCL).
  virtual bool overlaps() const = 0;
};

/// Builds the GPU step of `plan` on GPU comm.local_rank() (staged: GPU local_rank mod the
/// visible GPUs), from the host parameters of `state` (its pieces and, where they hold whole
/// parameters, the model's). Collective. Errors: as make_device_trainer; --gpu-transport nccl
/// with fewer GPUs than local ranks (names both, and the fix: --gpu-transport staged).
std::unique_ptr<DeviceParallel> make_device_parallel(const Model& model, const TrainConfig& config,
                                                     Communicator& comm, const DevicePlan& plan,
                                                     const TrainingState& state);

}  // namespace ringzero
