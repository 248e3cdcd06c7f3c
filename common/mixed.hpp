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
//  - linear_half: the Linear op of a 16-bit model (torch.autocast's linear): inputs rounded to
//    16 bits, the product accumulated in fp32, the output rounded to 16 bits; in backward the
//    incoming gradient, the input gradient and the parameter gradients are rounded too.
//  - MasterWeights: fp32 master weights + AdamW moments over a 16-bit parameter span; each
//    step converts the 16-bit gradient to fp32 (times the unscale/clip factor), updates the
//    master as AdamW::step does, and writes the master rounded to 16 bits back.
//  - GradScaler: fp16 dynamic loss scaling, torch.cuda.amp.GradScaler's defaults and update
//    rule; the overflow decision comes from every rank (found_inf_on_any_rank).
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

#include <nlohmann/json.hpp>

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "comm.hpp"
#include "config.hpp"
#include "half.hpp"
#include "nn.hpp"
#include "optim.hpp"
#include "safetensors.hpp"

namespace ringzero {

/// The Linear op in 16-bit (see the header comment). inp (B, C), weight (OC, C), bias (OC),
/// whose data must already hold 16-bit values (HalfStorage's hooks see to that) -> (B, OC).
/// Backward: dout rounded; dweight, dbias += fp32-accumulated products (HalfStorage rounds
/// them into the 16-bit gradient); dinp += the rounded input gradient. Errors: dtype fp32.
Var linear_half(Tape& tape, const Var& inp, Parameter& weight, Parameter& bias, Dtype dtype);

/// A Model's parameters and gradients in 16 bits. Construction rounds params_memory into
/// params16, FREES the model's fp32 params_memory and grads_memory, and re-points every
/// Parameter at a one-layer fp32 working copy; every Linear then runs linear_half.
/// Hooks, per Linear: pre-forward and pre-backward convert its 16-bit weight and bias into the
/// working copy (pre-backward also zeroes the gradient scratch); each parameter's first
/// gradient-ready hook adds the scratch, rounded to 16 bits, into grads16 (16-bit
/// accumulation, as PyTorch's AccumulateGrad does on a bf16 .grad). Construct it BEFORE any
/// object that adds gradient-ready hooks reading grads16 (buckets), so it runs first.
/// Memory: params16 2Ψ (parameters), grads16 2Ψ (gradients), working copy + gradient scratch
/// 2 × 4 × (largest layer's weight + bias) bytes (activations).
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
};

/// fp32 master weights and AdamW moments for a span of 16-bit parameters, cut into segments
/// with their own step counts exactly like AdamW. K = 12: master, exp_avg, exp_avg_sq, each
/// 4 bytes per element, tag optimizer_state. A ZeRO shard passes its own part.
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

 private:
  // The update, with load(begin, n, g) filling g[0, n) with the fp32 gradients of [begin, +n).
  template <class Load>
  void step_with(std::span<uint16_t> params16, int64_t n_grads, float grad_factor, Load load);
  Dtype dtype_;
  std::vector<int64_t> sizes_, steps_;
  AdamWOptions options_;
  Buffer master_, exp_avg_, exp_avg_sq_;
};

/// Whether any element is ±inf or NaN (a 16-bit exponent of all ones).
bool has_non_finite(Dtype dtype, std::span<const uint16_t> values);
/// Whether any float32 element is ±inf or NaN.
bool has_non_finite(std::span<const float> values);
/// Σ (to_fp32(g) * factor)², accumulated in float64 (global-norm clipping of 16-bit grads).
double sum_of_squares_half(Dtype dtype, std::span<const uint16_t> grads, float factor);
/// Σ (g * factor)² over float32 gradients, accumulated in float64.
double sum_of_squares(std::span<const float> grads, float factor);

/// local on any rank -> true on every rank (one MPI_Allreduce of one double, counted as
/// "metrics": it is a control message, not gradient traffic).
bool found_inf_on_any_rank(Communicator& comm, bool local);

/// torch.cuda.amp.GradScaler's defaults.
struct GradScalerOptions {
  float init_scale = 65536.0f;  ///< 2^16
  float growth_factor = 2.0f;
  float backoff_factor = 0.5f;
  int64_t growth_interval = 2000;
};

/// fp16 dynamic loss scaling (torch.cuda.amp.GradScaler, torch._amp_update_scale_): backward
/// is seeded with scale(); the optimizer sees the gradients times inv_scale(); after each step
/// update(found_inf) skips the step (returns false) and halves the scale when any gradient
/// on any rank overflowed, else counts a clean step and doubles the scale after
/// growth_interval clean steps in a row. The scale is a power of two, so scaling and
/// unscaling are exact (short of over/underflow).
class GradScaler {
 public:
  explicit GradScaler(GradScalerOptions options = {});
  float scale() const { return scale_; }
  /// 1 / scale in fp32 (torch: scale.double().reciprocal().float()).
  float inv_scale() const { return static_cast<float>(1.0 / static_cast<double>(scale_)); }
  /// Returns whether the optimizer step is to be taken (no overflow), then updates the scale.
  bool update(bool found_inf);
  int64_t skipped_steps() const { return skipped_; }
  int64_t growth_tracker() const { return growth_tracker_; }

 private:
  GradScalerOptions options_;
  float scale_;
  int64_t growth_tracker_ = 0, skipped_ = 0;
};

/// --precision bf16|fp16 for a model every rank holds whole (chapters 01-05): HalfStorage,
/// MasterWeights over every parameter, and (fp16) a GradScaler. A train_step in 16 bits is
///   zero_grad(); forward; tape.backward(loss, seed * loss_scale()); step(clip, comm);
/// Data parallel (chapters 03-05) pre-divides: seed = 1/(N·K), so the sum over ranks of the
/// 16-bit gradients is their mean and cannot overflow by a factor N (PyTorch's DDP Reducer
/// multiplies each gradient by 1/world_size as it copies it into the bucket, before the
/// all-reduce: reducer.cpp, copy_grad_to_bucket / mark_variable_ready_dense).
/// Memory: 2Ψ + 2Ψ + 12Ψ = 16Ψ model states, plus HalfStorage's one-layer working copy; a rank
/// built without master weights (chapter 03's ranks 1..N-1) holds 2Ψ + 2Ψ.
class MixedPrecision {
 public:
  /// Reads the model's fp32 parameters into the master weights (when master_weights), then
  /// moves the model to 16 bits (its fp32 buffers are freed). Errors: --precision fp32,
  /// --optimizer other than adamw, a --reduce-dtype that is neither fp32 nor the precision's.
  MixedPrecision(Model& model, const TrainConfig& config, bool master_weights = true);

  Dtype dtype() const { return storage_.dtype(); }
  /// The dtype gradients are summed in across ranks: --reduce-dtype, default the precision's.
  Dtype reduce_dtype() const { return reduce_dtype_; }
  bool has_master_weights() const { return master_.has_value(); }
  void zero_grad() { storage_.zero_grad(); }
  /// What backward's seed is multiplied by: the GradScaler's scale in fp16, 1 in bf16.
  float loss_scale() const { return scaler_ ? scaler_->scale() : 1.0f; }
  /// After backward: in fp16, decides overflow over every rank (comm may be null on one
  /// process) and skips the step on overflow; clips the unscaled gradients' global norm to
  /// clip_grad_norm (0: off) as clip_grad_norm_ does; updates the master weights and the
  /// 16-bit parameters. The gradients are grads16, or grads32 when given (summed in fp32,
  /// --reduce-dtype fp32; Ψ elements). Returns whether the optimizer stepped. Equals
  ///   update_scale(found_inf(grads32), comm) && (step_master(clip, grads32), true).
  bool step(float clip_grad_norm, Communicator* comm, std::span<const float> grads32 = {});
  /// fp16: whether the gradients the optimizer reads (grads16, or grads32 when given) hold an
  /// inf or NaN. bf16: false (no loss scale; a non-finite loss stops the run instead).
  bool found_inf(std::span<const float> grads32 = {}) const;
  /// fp16: the GradScaler's update with found_inf OR-ed over every rank (comm non-null: one
  /// all-reduce of a flag, counted as metrics; every rank must call it), so every rank keeps
  /// the same scale and skips the same steps. Returns whether to step. bf16: true, no message.
  bool update_scale(bool found_inf, Communicator* comm);
  /// The master weights' update (clipping as in step) without the overflow decision, for a
  /// rank that decided with update_scale (chapter 03's rank 0). Errors: no master weights.
  void step_master(float clip_grad_norm, std::span<const float> grads32 = {});
  /// fp16: a non-finite loss at step 1 is the forward overflowing fp16's range (no update has
  /// happened yet), not a divergence: stops with a message naming the fix. Call on every rank
  /// with the same loss (the global mean) so every rank stops.
  void check_first_loss(double loss, int64_t step) const;
  /// The fp32 master weights under the model's state_dict() names (for --save-final).
  std::map<std::string, NamedTensor> master_state_dict(const Model& model) const;
  /// "precision", and in fp16 "loss_scale" and "skipped_steps", for the summary record.
  nlohmann::json summary() const;
  /// The ledger formula line for one process.
  static std::string ledger_formula(Dtype dtype, int64_t psi);

  HalfStorage& storage() { return storage_; }
  /// Errors: this rank holds no master weights.
  const MasterWeights& master() const;

 private:
  std::optional<MasterWeights> master_;  // first: it reads the fp32 parameters HalfStorage frees
  HalfStorage storage_;
  Dtype reduce_dtype_;
  std::optional<GradScaler> scaler_;
};

/// AdamW's options of the run (--lr, --weight-decay; betas and eps PyTorch's defaults), for
/// MasterWeights.
AdamWOptions adamw_options(const TrainConfig& config);

/// A MixedPrecision when config.precision is bf16 or fp16, else null (fp32: nothing changes).
std::unique_ptr<MixedPrecision> make_mixed_precision(Model& model, const TrainConfig& config,
                                                     bool master_weights = true);

}  // namespace ringzero
