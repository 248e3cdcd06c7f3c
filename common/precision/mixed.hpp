// mixed: mixed-precision training with fp32 master weights (--precision bf16|fp16).
//
// The recipe of Micikevicius et al. 2018, "Mixed Precision Training" (§3), as the ZeRO paper
// (Rajbhandari et al. 2020, §3.1) counts it: 16-bit parameters (2Ψ) that forward and backward
// read, 16-bit gradients (2Ψ) that backward writes, and K = 12 bytes of optimizer state per
// parameter: the fp32 master weights (4Ψ) and AdamW's exp_avg and exp_avg_sq (4Ψ + 4Ψ).
//
// Provides:
//  - HalfStorage: moves a Model's parameters and gradients into 16-bit buffers and keeps ONE
//    layer's fp32 working copy (its weights, and a gradient scratch), filled by module hooks
//    just before that layer's forward and backward: the storage scheme of ZeRO-3's gather and
//    free, with a dtype conversion in place of the all-gather.
//  - (linear_half, the Linear op a 16-bit model runs, is an op: common/core/ops.hpp.)
//  - MasterWeights: fp32 master weights + AdamW moments over a 16-bit parameter span; each
//    step converts the 16-bit gradient to fp32 (times the unscale/clip factor), updates the
//    master as AdamW::step does, and writes the master rounded to 16 bits back.
//  - (has_non_finite and sum_of_squares(_half), the overflow test and the clipping norm of
//    16-bit or fp32-summed gradients, are common/core/half.hpp's, where a device can run them.)
// Put together elsewhere: GradScaler (fp16 dynamic loss scaling, grad_scaler.hpp, included
// here for the ZeRO chapters, which build their own masters and scaler); MixedPrecision (the
// whole recipe for a model every rank holds whole, chapters 01-05, mixed_precision.hpp).
//
// Why a GEMM on fp32 copies is a 16-bit GEMM: a bf16 value has an 8-bit significand and an
// fp16 value an 11-bit one, so the product of two of them has at most 16 (resp. 22)
// significant bits and is EXACT in float32 (24 bits); and both exponent ranges fit inside
// float32's. So Eigen's fp32 GEMM on float copies of 16-bit values computes exactly the
// products a 16-bit x 16-bit -> fp32 multiply-accumulate unit (a tensor core, AVX-512 BF16's
// vdpbf16ps) computes, and accumulates them in fp32: the results differ from such a unit only
// by the order of the fp32 additions, as any two GEMMs do. tests/unit/half_test.cpp checks
// the exactness of the products.
//
// Which tensors are 16-bit: the parameters and gradients (Buffer16), the inputs and outputs
// of every Linear and their gradients (rounded to 16-bit values; stored in fp32 Tensors, so
// the ledger counts activations at 4 bytes per element), ReLU (16-bit in, 16-bit out). The
// loss and the softmax run in fp32 (autocast's fp32 list: cross_entropy, mse_loss).
// Leaves out: 16-bit activation storage, fp8, per-layer precision policies.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "common/core/half.hpp"
#include "common/core/nn.hpp"
#include "common/core/ops.hpp"
#include "common/core/optim.hpp"
#include "common/driver/config.hpp"
#include "common/precision/grad_scaler.hpp"

namespace ringzero {

/// A Model's parameters and gradients in 16 bits. Construction rounds params_memory into
/// params16, FREES the model's fp32 params_memory and grads_memory, and re-points every
/// Parameter at a one-layer fp32 working copy; every Linear then runs linear_half.
/// Hooks, per Linear: pre-forward and pre-backward convert its 16-bit weight and bias into the
/// working copy (pre-backward also zeroes the gradient scratch); each parameter's first
/// gradient-ready hook adds the scratch, rounded to 16 bits, into grads16 (16-bit
/// accumulation, as PyTorch's AccumulateGrad does on a bf16 .grad). Construct it BEFORE any
/// object that adds gradient-ready hooks reading grads16 (buckets), so it runs first.
/// Memory, where the model lives (the host or its device): params16 2Ψ (parameters), grads16 2Ψ
/// (gradients), working copy + gradient scratch 2 × 4 × (largest layer's weight + bias) bytes
/// (activations).
/// Errors: dtype fp32; the model's buffers already released.
class HalfStorage {
 public:
  HalfStorage(Model& model, Dtype dtype);
  /// The same scheme on a caller's layout (ZeRO's padded buckets, chapters 06-07): parameter i
  /// (registration order) lives in params16[param_offsets[i], + numel); construction rounds the
  /// model's fp32 parameters into it and frees the model's fp32 buffers, as above. The 16-bit
  /// gradient each parameter's hook adds into is set with set_grad16 (before its backward);
  /// params16/grads16 above stay empty. params16 must outlive this object.
  /// Errors: dtype fp32; an offset or size outside params16; the model's buffers released.
  HalfStorage(Model& model, Dtype dtype, std::span<uint16_t> params16,
              const std::vector<int64_t>& param_offsets);
  /// Where parameter i's gradient is accumulated from now on (numel elements; ZeRO-2 points it
  /// at the bucket in flight, as chapter 07 re-points Parameter::grad in fp32); empty: none, and
  /// a backward that reaches the parameter stops with an error. Errors: a size other than numel.
  void set_grad16(size_t param, std::span<uint16_t> grad16);
  HalfStorage(const HalfStorage&) = delete;
  HalfStorage& operator=(const HalfStorage&) = delete;

  Dtype dtype() const { return dtype_; }
  /// Sets every 16-bit gradient to zero (zero_grad(set_to_none=False)).
  void zero_grad();
  /// The parameters as float32 values (exact), registration order: for saving and tests.
  std::vector<float> params_as_float() const;

  Buffer16 params16;  ///< (Ψ) 16-bit parameters, Model's flat layout; tag parameters
  Buffer16 grads16;   ///< (Ψ) 16-bit gradients, same layout; tag gradients

 private:
  void load_layer(size_t layer);  // params16 -> working copy, parameters pointed at it
  void hook_layers();             // the working copy, the module and gradient-ready hooks
  Model& model_;
  Dtype dtype_;
  Buffer work_, grad_scratch_;  // largest layer's (weight + bias) elements; tag activations
  std::vector<std::span<uint16_t>> param16_of_, grad16_of_;  // (P) each parameter's 16 bits
  ModuleHooks hooks_;  // the layers' module hooks, removed with this object (nn.hpp)
};

/// fp32 master weights and AdamW moments for a span of 16-bit parameters, cut into segments
/// with their own step counts exactly like AdamW. K = 12: master, exp_avg, exp_avg_sq, each
/// 4 bytes per element, tag optimizer_state. A ZeRO shard passes its own part. The state lives
/// where `initial` does (the host, or the model's device: every update runs there).
class MasterWeights {
 public:
  /// master = initial (the fp32 values the 16-bit parameters were rounded from).
  /// Errors: dtype fp32; segment sizes not summing to initial.size(); bad AdamW options.
  MasterWeights(Dtype dtype, std::span<const float> initial, std::vector<int64_t> segment_sizes,
                AdamWOptions options = {});

  /// g = to_fp32(grads16[i]) * grad_factor (1/scale for fp16, times a clip coefficient), then
  /// AdamW::step's update of master[i] and the moments, then params16[i] = to_16(master[i]).
  /// Each segment's step count advances by one. Errors: sizes differ from the state's.
  void step(std::span<uint16_t> params16, std::span<const uint16_t> grads16, float grad_factor);
  /// The same update from fp32 gradients (grads32[i] * grad_factor): gradients summed across
  /// ranks in fp32 (--reduce-dtype fp32, FSDP's reduce_dtype=float32). Errors: as above.
  void step(std::span<uint16_t> params16, std::span<const float> grads32, float grad_factor);

  std::span<const float> master() const { return master_.span(); }
  std::span<const float> exp_avg() const { return exp_avg_.span(); }
  std::span<const float> exp_avg_sq() const { return exp_avg_sq_.span(); }
  const std::vector<int64_t>& segment_steps() const { return steps_; }
  Dtype dtype() const { return dtype_; }
  // The same state, writable: what a checkpoint loads into (common/io/checkpoint.hpp).
  std::span<float> master() { return master_.span(); }
  std::span<float> exp_avg() { return exp_avg_.span(); }
  std::span<float> exp_avg_sq() { return exp_avg_sq_.span(); }
  std::vector<int64_t>& segment_steps() { return steps_; }

 private:
  // The update, with load(begin, g) filling g with the fp32 gradients of [begin, + g.size()).
  template <class Load>
  void step_with(std::span<uint16_t> params16, int64_t n_grads, float grad_factor, Load load);
  Dtype dtype_;
  std::vector<int64_t> sizes_, steps_;
  AdamWOptions options_;
  Buffer master_, exp_avg_, exp_avg_sq_;
};

/// AdamW's options of the run (--lr, --weight-decay; betas and eps PyTorch's defaults), for
/// MasterWeights.
AdamWOptions adamw_options(const TrainConfig& config);

}  // namespace ringzero
