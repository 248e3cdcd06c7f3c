// precision: the run's precision for a model every rank holds whole (chapters 01-05), written
// once, so that each chapter's train_step is the fp32 algorithm whatever --precision says.
//
// Provides: ReplicatedPrecision, which a lesson object of chapters 01-04, or chapter 05's DDP
// engine, holds in place of an Optimizer (the Precision of common/core/step.hpp, and more). What a
// train_step calls on it does the fp32 thing in fp32 and nothing more:
//   zero_grad()            the gradients to zero (the model's fp32 ones, or the 16-bit ones)
//   seed(K)                backward's seed: 1/K in fp32; loss_scale/(N·K) in 16 bits
//   check_first_loss(...)  fp16 only: a non-finite loss at step 1 is the forward overflowing
//   reduce(sum)            the chapter's collective on the gradients in the reduce dtype, then
//                          the mean (fp32: ÷N after the sum, the bitwise chain to chapter 02)
//   step(comm)             clip + --optimizer (fp32), or the fp32 master weights' AdamW step
//                          (16 bits; fp16 skips it on an overflow found on any rank)
// The three variants are objects that do nothing when unused (nanoGPT's
// GradScaler(enabled=...)): the loss scale is 1 outside fp16, the averaging policy divides after
// the sum in fp32 and pre-divides in the seed in 16 bits (PyTorch's DDP Reducer divides each
// gradient by world_size before its all-reduce, reducer.cpp), and --reduce-dtype is one
// communication hook here (PyTorch's comm hooks: widen to fp32, run the collective, read the
// fp32 sum) instead of a branch in each chapter. The collective itself is the chapter's, written
// once over the element type: reduce() calls sum(grads, scratch) with spans of float, bf16 or
// fp16 (common/core/half.hpp).
// Leaves out: sharded optimizers (chapters 06-08 build their own masters and scaler).
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>

#include "common/comm/collectives.hpp"
#include "common/comm/comm.hpp"
#include "common/core/half.hpp"
#include "common/core/nn.hpp"
#include "common/core/optim.hpp"
#include "common/core/step.hpp"
#include "common/driver/config.hpp"
#include "common/io/checkpoint.hpp"
#include "common/io/safetensors.hpp"
#include "common/precision/mixed_precision.hpp"
#include "common/report/trace.hpp"
#include "common/zero/zero_memory.hpp"

namespace ringzero {

/// Parameters, gradients and optimizer of a model every rank holds whole, in --precision.
/// fp32: the model's own buffers and --optimizer over every parameter. bf16/fp16:
/// MixedPrecision (16-bit parameters and gradients, fp32 master weights + AdamW moments,
/// fp16's GradScaler). Construct it before any object that adds gradient-ready hooks reading
/// the gradients (DDP's), so that the 16-bit gradients are written first.
class ReplicatedPrecision : public Precision {
 public:
  /// world_size: N, the ranks whose gradients are summed (1 on one process). holds_optimizer:
  /// false on a rank that never steps (chapter 03's ranks 1..N-1). Errors: as MixedPrecision's
  /// and Optimizer's (16 bits needs --optimizer adamw).
  ReplicatedPrecision(Model& model, const TrainConfig& config, int world_size,
                      bool holds_optimizer = true);

  /// Allocates what reduce() needs, tag comm_buffers: `chunk` elements of the reduce dtype for
  /// the collective's incoming data (one ring chunk, or one whole gradient for a star), and in
  /// 16 bits with --reduce-dtype fp32 the Ψ gradients widened to fp32.
  void reserve_scratch(int64_t chunk);

  void zero_grad() override;
  /// Backward's seed for the mean of K micro-batch means: 1/K in fp32 (summed over ranks, then
  /// ÷N: chapter 02's numbers at N = 1); loss_scale/(N·K) in 16 bits (pre-divided, so the
  /// 16-bit sum is the mean and cannot overflow by a factor N).
  float seed(int64_t grad_accum_steps) const override;
  /// What backward's seed is multiplied by: the GradScaler's scale in fp16, else exactly 1 (so
  /// multiplying a seed by it changes no bit).
  float loss_scale() const override { return mixed_ ? mixed_->loss_scale() : 1.0f; }
  /// fp16: a non-finite loss at step 1 (no update yet) is the forward overflowing fp16's range;
  /// stops with a message naming the fix. Does nothing otherwise. Call on every rank.
  void check_first_loss(double loss, int64_t step) const override;

  /// Sums the gradients [offset, offset + n) over ranks with the chapter's collective and makes
  /// them the mean: sum(std::span<T> grads, std::span<T> scratch), T the reduce dtype's element
  /// type (float, bf16, fp16); fp32 reduce of 16-bit gradients widens them first (into the
  /// fp32 copy the optimizer then reads); fp32 training divides by N after the sum.
  template <class Sum>
  void reduce(int64_t offset, int64_t n, Sum&& sum) {
    if (!mixed_) {
      std::span<float> grads = model_.grads_memory.span().subspan(offset, n);
      sum(grads, scratch32_.span());
      divide_in_place(grads, static_cast<float>(world_size_));  // the mean: g /= N
    } else if (grads32_.size() > 0) {  // --reduce-dtype fp32: widen, sum in fp32
      std::span<float> grads = grads32_.span().subspan(offset, n);
      convert_to_float(mixed_->dtype(), grads16().subspan(offset, n), grads);
      sum(grads, scratch32_.span());
    } else if (mixed_->dtype() == Dtype::bf16) {
      sum(as_elements<bf16>(grads16()).subspan(offset, n), scratch_bf16_.span());
    } else {
      sum(as_elements<fp16>(grads16()).subspan(offset, n), scratch_fp16_.span());
    }
  }
  /// reduce() over every gradient.
  template <class Sum>
  void reduce(Sum&& sum) {
    reduce(0, psi_, sum);
  }

  /// The optimizer step on the mean gradients, with --clip-grad-norm: clip and --optimizer in
  /// fp32; in 16 bits the master weights' step, then the 16-bit parameters. holds_sum: whether
  /// this rank holds the mean (false on chapter 03's ranks 1..N-1, which do not step). fp16: the
  /// overflow verdict of the ranks holding the sum goes to every rank (comm non-null: one
  /// all-reduce of a flag, counted as metrics), so every rank skips the same steps. Returns
  /// whether the optimizer stepped.
  bool step(Communicator* comm, bool holds_sum = true);
  /// step() of one process: step(nullptr).
  bool step() override { return step(nullptr); }
  /// step() records an "optimizer step" span (cat "optimizer") into `tracer` while it is
  /// enabled (EngineLesson sets it for --trace; null: none).
  void trace_into(Tracer* tracer) { tracer_ = tracer; }

  /// f(std::span<T> params) with the parameters in their element type (float, bf16, fp16): what
  /// a broadcast of the weights moves.
  template <class F>
  void visit_params(F&& f) {
    if (!mixed_) return f(model_.params_memory.span());
    std::span<uint16_t> bits = mixed_->storage().params16.span();
    if (mixed_->dtype() == Dtype::bf16) return f(as_elements<bf16>(bits));
    f(as_elements<fp16>(bits));
  }

  // ---- for the lesson's reporting and the run driver ----
  bool is_fp32() const { return !mixed_; }
  Dtype dtype() const { return mixed_ ? mixed_->dtype() : Dtype::fp32; }
  /// Bytes of one gradient element on the wire (4, or 2 with a 16-bit --reduce-dtype).
  int grad_wire_bytes() const;
  /// Bytes of one parameter element (4, or 2 in 16 bits).
  int param_bytes() const { return mixed_ ? 2 : 4; }
  /// Errors, before training, unless `collectives` can sum the gradients' --reduce-dtype:
  /// --collectives mpi needs fp32 (MPI has no bf16/fp16 sum). Call on every rank.
  void check_collectives(Collectives collectives) const;
  /// The ledger's formula line of a rank that holds every model state (chapters 04 and 05):
  /// "formula (fp32 + AdamW, every rank): 4Ψ + 4Ψ + 8Ψ = 16Ψ = ...; comm_buffers: one chunk of the
  /// largest <unit>"; in 16 bits 2Ψ + 2Ψ + 12Ψ (ZeRO paper §3.1), with the fp32-widened
  /// gradient where --reduce-dtype is fp32. `unit`: "parameter" (one all-reduce each) or "bucket".
  std::string replicated_ledger_formula(const std::string& unit) const;
  /// The optimizer of an fp32 run on a rank that holds it (tests, checkpoints). Errors: none
  /// here (16 bits, or a rank without one).
  Optimizer& optimizer();
  /// This rank's training state for checkpoints (common/io/checkpoint.hpp): the parameters and
  /// --optimizer's state in fp32; in 16 bits the fp32 master weights, their moments and fp16's
  /// loss scaler, and on load the 16-bit parameters rounded from the masters. A rank that does
  /// not step (chapter 03's 1..N-1) holds no optimizer state; it loads the parameters.
  TrainingState training_state(Model& model);
  /// "precision" (and fp16's "loss_scale", "skipped_steps") in 16 bits; {} in fp32.
  nlohmann::json summary() const;
  /// The weights --save-final writes: the model's in fp32, the fp32 master weights in 16 bits
  /// (empty on a rank without them).
  std::map<std::string, NamedTensor> state_dict(const Model& model) const;
  /// In 16 bits the fp32 model existed during set-up only: the ledger's peaks start after it.
  bool reset_ledger_peaks() const { return mixed_ != nullptr; }

 private:
  std::span<uint16_t> grads16() { return mixed_->storage().grads16.span(); }

  Model& model_;
  int world_size_;
  int64_t psi_;
  float clip_grad_norm_;
  StateBytes states_;  // bytes per parameter in fp32: p, g and --optimizer's state
  std::unique_ptr<MixedPrecision> mixed_;  // null in fp32; first, before any gradient hook
  std::optional<Optimizer> optimizer_;     // fp32, on a rank that steps
  Buffer scratch32_;                       // the collective's incoming data, fp32 sums
  BufferOf<bf16> scratch_bf16_;            // the same, --reduce-dtype bf16
  BufferOf<fp16> scratch_fp16_;            // the same, --reduce-dtype fp16
  Buffer grads32_;                         // 16 bits, --reduce-dtype fp32: (Ψ) widened
  Tracer* tracer_ = nullptr;               // --trace: step()'s span
};

}  // namespace ringzero
