// mixed_precision: --precision bf16|fp16 for a model every rank holds whole (chapters 01-05).
//
// MixedPrecision puts together mixed.hpp's parts, as torch.autocast + an fp32-master AdamW +
// torch.cuda.amp.GradScaler do in PyTorch: HalfStorage (16-bit parameters and gradients),
// MasterWeights over every parameter (fp32 master weights and AdamW moments, K = 12) and, in
// fp16, a GradScaler (grad_scaler.hpp). The recipe is Micikevicius et al. 2018, "Mixed Precision
// Training" (§3); the ZeRO chapters (06-08) shard the same parts instead (shard_precision.hpp,
// zero3.hpp).
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>

#include "common/comm/comm.hpp"
#include "common/core/half.hpp"
#include "common/core/nn.hpp"
#include "common/driver/config.hpp"
#include "common/io/safetensors.hpp"
#include "common/precision/grad_scaler.hpp"
#include "common/precision/mixed.hpp"

namespace ringzero {

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
  /// --optimizer other than adamw. --reduce-dtype is taken as given: that it is fp32 or the
  /// precision's is checked once, before any chapter is built (PrecisionCheck,
  /// common/driver/run.cpp).
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
  /// The master weights (null on a rank without them) and fp16's loss scaler (null otherwise):
  /// what a checkpoint saves and loads (common/io/checkpoint.hpp).
  MasterWeights* master_if_held() { return master_ ? &*master_ : nullptr; }
  GradScaler* scaler() { return scaler_ ? &*scaler_ : nullptr; }

 private:
  std::optional<MasterWeights> master_;  // first: it reads the fp32 parameters HalfStorage frees
  HalfStorage storage_;
  Dtype reduce_dtype_;
  std::optional<GradScaler> scaler_;
};

/// fp16 (`dtype`): a non-finite loss at step 1, before any update, is the forward overflowing
/// fp16's range (e.g. large --init-from weights), not a divergence: stops with a message naming
/// the fix. Does nothing for another dtype or step. Call on every rank with the global loss.
void check_fp16_first_loss(Dtype dtype, double loss, int64_t step);

/// --reduce-dtype, default the --precision's (the values allowed are checked before set-up,
/// common/driver/run.cpp's PrecisionCheck).
Dtype reduce_dtype_of(const TrainConfig& config);

/// A MixedPrecision when config.precision is bf16 or fp16, else null (fp32: nothing changes).
std::unique_ptr<MixedPrecision> make_mixed_precision(Model& model, const TrainConfig& config,
                                                     bool master_weights = true);

}  // namespace ringzero
