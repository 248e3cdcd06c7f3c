// shard_precision: the run's precision for an engine that shards the optimizer (ZeRO, chapters
// 06-08), written once, so that each engine is written over its element types with no 16-bit
// branch; the sharded counterpart of precision.hpp's ReplicatedPrecision.
//
// An engine is a template over two element types (common/core/half.hpp), chosen once from the flags
// (llm.c's floatX): T, the parameters' and gradients' (--precision: float, bf16 or fp16), and R,
// the reduced gradient's (--reduce-dtype, default T). Provides ShardOptimizer: this rank's
// optimizer over its shard, one per unit (bucket or layer): fp32: --optimizer over the unit's
// segments; bf16/fp16: the fp32 master weights and AdamW moments of the shard (MasterWeights,
// 12 bytes per element: Rajbhandari et al. 2020, §3.1), whose step writes the shard back
// rounded to T. It also holds what does nothing outside 16 bits: the backward seed (1/K in
// fp32; loss_scale/(N·K), the mean pre-divided, in 16 bits) and fp16's GradScaler (its overflow
// verdict taken over every rank). And the ledger's formula line of a ZeRO engine
// (zero_ledger_formula), derived whole for ZeRO-1 and ZeRO-2 (bucket_zero_ledger_formula).
// with_precision (common/precision/with_precision.hpp) picks T and R once, from the flags; moving
// values between an engine's buffers of T and R is common/precision/shard_buffers.hpp (included
// here). Leaves out: the layouts, buffers and collectives (the chapters').
#pragma once

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "common/comm/comm.hpp"
#include "common/core/check.hpp"
#include "common/core/half.hpp"
#include "common/core/nn.hpp"
#include "common/core/optim.hpp"
#include "common/core/step_time.hpp"
#include "common/driver/config.hpp"
#include "common/io/checkpoint.hpp"
#include "common/precision/mixed.hpp"
#include "common/precision/mixed_precision.hpp"
#include "common/precision/shard_buffers.hpp"
#include "common/precision/with_precision.hpp"
#include "common/report/metrics.hpp"
#include "common/report/trace.hpp"
#include "common/zero/padded_buffer.hpp"
#include "common/zero/sharded_clip.hpp"
#include "common/zero/zero_memory.hpp"

namespace ringzero {

/// This rank's real elements of one unit's shard (a bucket's, chapters 06-07; a layer's, 08).
struct ShardPiece {
  int64_t model_offset = 0;       ///< its first element in the model's unpadded flat layout
  std::vector<int64_t> segments;  ///< sizes of its parameter pieces, memory order (Σ = real)
};

/// This rank's piece of every unit of a layout (`units`: chapter 06's BucketShards, a bucket or
/// a layer each, which give offset, shard_size and segments): rank r's shard starts at offset +
/// r·shard_size (a piece with no segments, padding only, has no elements to read).
template <class Units>
std::vector<ShardPiece> shard_pieces(const Units& units, int rank) {
  std::vector<ShardPiece> pieces;
  for (const auto& s : units) pieces.push_back({s.offset + rank * s.shard_size, s.segments});
  return pieces;
}

/// This rank's optimizer over its shard of every unit, in --precision (see the header).
/// Collective where noted: every rank calls in the same order.
class ShardOptimizer {
 public:
  /// Reads the masters (16 bits) from the model's fp32 parameters: build it before the
  /// parameters move (ParameterBinding frees them). world_size: N. Errors: 16 bits with an
  /// --optimizer other than adamw; the model's fp32 parameters already released (16 bits).
  ShardOptimizer(const Model& model, const TrainConfig& config,
                 const std::vector<ShardPiece>& pieces, int world_size);

  Dtype dtype() const { return dtype_; }
  Dtype reduce_dtype() const { return reduce_dtype_; }
  /// Errors unless T and R are the element types of --precision and --reduce-dtype: an engine
  /// built for other types than the flags' (build lessons through Run::train<Lesson>, which
  /// picks them with with_precision).
  template <Element T, Element R>
  void check_types() const {
    RZ_CHECK(dtype_of<T>() == dtype_ && dtype_of<R>() == reduce_dtype_,
             "this engine is built for parameters in "
                 << dtype_name(dtype_of<T>()) << " and a reduction in " << dtype_name(dtype_of<R>())
                 << ", the flags ask for --precision " << dtype_name(dtype_) << " --reduce-dtype "
                 << dtype_name(reduce_dtype_)
                 << ": build the lesson with Run::train<Lesson> "
                    "(common/precision/with_precision.hpp)");
  }
  /// Bytes per parameter of p, g and K: fp32_state_bytes(--optimizer), or 2, 2, 12 in 16 bits.
  StateBytes state_bytes() const { return state_bytes_; }
  /// The GradScaler's scale in fp16, else exactly 1.
  float loss_scale() const { return scaler_ ? scaler_->scale() : 1.0f; }
  /// Backward's seed for the mean of K micro-batch means: 1/K in fp32 (the reduce divides the
  /// sum by N); loss_scale/(N·K) in 16 bits (pre-divided, as PyTorch's DDP Reducer divides
  /// every gradient by world_size before its all-reduce: the 16-bit sum is the mean and cannot
  /// overflow by a factor N).
  float seed(int64_t grad_accum_steps) const;
  /// fp16: a non-finite loss at step 1, before any update, is the forward overflowing fp16's
  /// range: stops with a message naming the fix. Does nothing otherwise. Call on every rank.
  void check_first_loss(double loss, int64_t step) const;

  /// Collective, after the reduce: `grads` is this rank's reduced gradient shard (its real
  /// elements), every unit. fp32: clips them in place with --clip-grad-norm over every rank's
  /// shards (clip_sharded_grad_norm). 16 bits: fp16's overflow verdict OR-ed over every rank
  /// (on an overflow every rank returns false, the scale halves, nothing steps), then the
  /// factor step() multiplies the gradients by: 1/scale times the clip coefficient over every
  /// rank's shards, added in rank order. Returns whether to step.
  template <Element R>
  bool prepare(Communicator& comm, const std::vector<std::span<R>>& grads);

  /// Unit u's optimizer step on this rank's shard: params (T) and grads (R), its real elements.
  /// fp32: --optimizer's step. 16 bits: the masters' AdamW step from grads × prepare()'s factor,
  /// then params = the masters rounded to T. Errors: sizes other than the unit's.
  template <Element T, Element R>
  void step(size_t u, std::span<T> params, std::span<R> grads) {
    const auto span = span_if(tracer_, "optimizer step", "optimizer");
    const PartScope part(StepPart::optimizer);  // --attribute
    if constexpr (std::is_same_v<T, float>) {
      optimizers_[u].step(params, grads);
    } else if constexpr (std::is_same_v<R, float>) {
      masters_[u].step(as_bits(params), std::span<const float>(grads), factor_);
    } else {
      masters_[u].step(as_bits(params), as_bits(std::span<const R>(grads)), factor_);
    }
  }

  // ---- the state, for reports, --save-optimizer-state and checkpoints ----
  size_t units() const { return masters_.empty() ? optimizers_.size() : masters_.size(); }
  /// Unit u's fp32 master weights (16 bits). Errors: an fp32 run (its parameters are the state).
  std::span<const float> master(size_t u) const;
  /// Unit u's AdamW moments and per-segment step counts. Errors: --optimizer sgd.
  std::span<const float> exp_avg(size_t u) const;
  std::span<const float> exp_avg_sq(size_t u) const;
  const std::vector<int64_t>& segment_steps(size_t u) const;
  /// {} in fp32; "precision", "reduce_dtype", and in fp16 "loss_scale", "skipped_steps".
  nlohmann::json summary() const;
  /// Unit u's share of a checkpoint (common/io/checkpoint.hpp) at `global_offset` of the model's
  /// flat layout, its segments those of parameters `segment_params`: in fp32 `params` (the
  /// unit's real shard elements) and its --optimizer; in 16 bits the unit's fp32 master weights
  /// and moments (`params` unused: the engine's load_params rounds them from the masters).
  StatePiece state_piece(size_t u, std::span<float> params, int64_t global_offset,
                         std::vector<int> segment_params);
  /// step() records an "optimizer step" span per unit (cat "optimizer") into `tracer` while it
  /// is enabled (EngineLesson sets it for --trace; null: none).
  void trace_into(Tracer* tracer) { tracer_ = tracer; }
  /// fp16's loss scaler, else null (checkpoints).
  GradScaler* scaler() { return scaler_ ? &*scaler_ : nullptr; }

 private:
  const AdamW& adamw(size_t u) const;
  Dtype dtype_, reduce_dtype_;
  int world_size_;
  float clip_grad_norm_;
  StateBytes state_bytes_;
  float factor_ = 1.0f;                 // 16 bits: 1/scale × clip coefficient of this step
  Tracer* tracer_ = nullptr;            // --trace: step()'s spans
  std::vector<Optimizer> optimizers_;   // fp32: (units) each over this rank's real elements
  std::vector<MasterWeights> masters_;  // 16 bits: (units) the same, fp32 masters + moments
  std::optional<GradScaler> scaler_;    // fp16 only
};

template <Element R>
bool ShardOptimizer::prepare(Communicator& comm, const std::vector<std::span<R>>& grads) {
  const PartScope part(StepPart::optimizer);  // --attribute; its all-reduces are communication
  if constexpr (std::is_same_v<R, float>) {
    if (dtype_ == Dtype::fp32) {
      if (clip_grad_norm_ > 0) clip_sharded_grad_norm(comm, grads, clip_grad_norm_);
      return true;
    }
  }
  auto non_finite = [&](std::span<R> g) {
    if constexpr (std::is_same_v<R, float>)
      return has_non_finite(std::span<const float>(g));
    else
      return has_non_finite(dtype_, as_bits(std::span<const R>(g)));
  };
  auto squares = [&](std::span<R> g) {
    if constexpr (std::is_same_v<R, float>)
      return sum_of_squares(std::span<const float>(g), factor_);
    else
      return sum_of_squares_half(dtype_, as_bits(std::span<const R>(g)), factor_);
  };
  factor_ = scaler_ ? scaler_->inv_scale() : 1.0f;
  if (scaler_) {
    bool found_inf = false;
    for (std::span<R> g : grads) found_inf = found_inf || non_finite(g);
    if (!scaler_->update(found_inf_on_any_rank(comm, found_inf))) return false;
  }
  if (clip_grad_norm_ > 0) {
    std::vector<double> sums(static_cast<size_t>(comm.world_size()), 0.0);  // (N) Σ g²
    for (std::span<R> g : grads) sums[comm.rank()] += squares(g);
    factor_ *= clip_coefficient(sum_in_rank_order(comm, sums), clip_grad_norm_);
  }
  return true;
}

/// A ZeRO engine's ledger formula line, written once for stages 1-3: "formula (ZeRO-<stage>,
/// <states>): <the paper's formula> = <bytes> per rank<extra> (DDP: <one full copy> = <bytes>);
/// exactly, with padding <padding>: <terms> = <exact[0]>, ... B on ranks 0..N-1<tail>". `terms`:
/// the exact byte formula, `exact`: bytes per rank (ZeRO-3's chapter writes its own; ZeRO-1's and
/// ZeRO-2's are derived below). `b`: the state bytes per parameter, b.grad what the engine's
/// gradient holds.
struct ZeroFormulaLine {
  int stage = 1;
  std::string states;  ///< e.g. "fp32 + AdamW" (StateBytes::name)
  StateBytes b;
  int64_t psi = 0;  ///< Ψ
  int world_size = 1;
  int64_t padding = 0;          ///< elements of padding over all units
  std::string terms;            ///< e.g. "4(Ψ + padding) + 4(Ψ + padding) + 8·(real shard)"
  std::vector<int64_t> exact;   ///< (N) the model-state bytes of each rank
  std::string extra, tail;      ///< after "per rank" and at the end
};

inline std::string zero_ledger_formula(const ZeroFormulaLine& l) {
  const double psi = static_cast<double>(l.psi);
  std::string exact;
  for (int64_t x : l.exact) exact += (exact.empty() ? "" : ", ") + std::to_string(x);
  return "formula (ZeRO-" + std::to_string(l.stage) + ", " + l.states +
         "): " + zero_formula_text(l.stage, l.b) + " = " +
         human_bytes(zero_model_state_bytes(l.stage, psi, l.world_size, l.b).total()) +
         " per rank" + l.extra + " (DDP: " + full_copy_formula_text(l.b) + " = " +
         human_bytes(l.b.per_param() * psi) + "); exactly, with padding " +
         std::to_string(l.padding) + ": " + l.terms + " = " + exact + " B on ranks 0..N-1" + l.tail;
}

/// ZeRO-1's and ZeRO-2's ledger formula line (chapters 06-07), derived from what the engine is:
/// `stage`, `padding` (elements), the bytes of its buckets in flight at the peak (stage 2's
/// double buffer, 0 for stage 1), its optimizer (element types, state bytes), Ψ and `exact`,
/// each rank's model-state bytes (the chapter's theory: its model_states_bytes()). The terms:
/// stage 1 p(Ψ + padding) + p(Ψ + padding) + K·(real shard); stage 2 p(Ψ + padding) + g·(shard) +
/// K·(real shard), with g the reduce dtype's bytes. In 16 bits the states are named after the
/// element type and the fp32 master weights, and a note adds HalfStorage's working copies.
inline std::string bucket_zero_ledger_formula(int stage, int64_t padding, int64_t in_flight_bytes,
                                              const ShardOptimizer& optimizer, int64_t psi,
                                              std::vector<int64_t> exact) {
  RZ_CHECK(stage == 1 || stage == 2, "bucket_zero_ledger_formula: ZeRO stage "
                                         << stage << " (1 or 2; ZeRO-3 writes its own)");
  StateBytes b = optimizer.state_bytes();
  const int world_size = static_cast<int>(exact.size());  // one entry per rank
  const bool fp32 = optimizer.dtype() == Dtype::fp32;
  const std::string p = std::to_string(static_cast<int>(b.param)),
                    k = std::to_string(static_cast<int>(b.optimizer)),
                    note = fp32 ? ""
                                : "; plus one layer's fp32 working copy and gradient scratch "
                                  "(activations)";
  ZeroFormulaLine l{.stage = stage,
                    .states = fp32 ? std::string(b.name)
                                   : std::string(dtype_name(optimizer.dtype())) +
                                         " + AdamW with fp32 master weights",
                    .psi = psi,
                    .world_size = world_size,
                    .padding = padding,
                    .terms = p + "(Ψ + padding) + " + p + "(Ψ + padding) + " + k + "·(real shard)",
                    .exact = std::move(exact),
                    .tail = note};
  if (stage == 2) {  // the gradient is a shard of the reduce dtype, and two buckets in flight
    b.grad = dtype_bytes(optimizer.reduce_dtype());
    const std::string g = std::to_string(static_cast<int>(b.grad));
    l.terms = p + "(Ψ + padding) + " + g + "·(shard) + " + k + "·(real shard)";
    l.extra = std::string(", + at most two ") + (fp32 ? "" : "16-bit ") +
              "buckets in flight = " + human_bytes(static_cast<double>(in_flight_bytes));
    l.tail = " between steps, + " + std::to_string(in_flight_bytes) + " B in flight at the peak " +
             (fp32 ? "(K = 1; with K > 1 every bucket stays through accumulation)" : "(K = 1)") +
             note;
  }
  l.b = b;
  return zero_ledger_formula(l);
}

}  // namespace ringzero
