// zero_memory: the ZeRO paper's memory and communication formulas, in one place.
//
// Provides: the model-state bytes per rank of data parallelism (DDP, "ZeRO-0") and of ZeRO
// stages 1, 2 and 3 for Ψ parameters on N ranks, given the bytes each parameter costs
// (Rajbhandari et al. 2020, "ZeRO: Memory Optimizations Toward Training Trillion Parameter
// Models", §3 and Figure 1):
//
//   stage 0 (DDP)   (p + g + K)Ψ            every rank holds everything
//   stage 1         pΨ + gΨ + KΨ/N          optimizer state sharded
//   stage 2         pΨ + (g + K)Ψ/N         optimizer state and gradients sharded
//   stage 3         (p + g + K)Ψ/N          everything sharded
//
// with p, g the bytes of a parameter and of a gradient and K the optimizer's bytes per
// parameter (the ZeRO paper's K, written K_os in the docs): fp32 + Adam p = g = 4, K = 8 (exp_avg,
// exp_avg_sq); mixed precision
// + Adam (the paper's) p = g = 2, K = 12 (fp32 master weights, exp_avg, exp_avg_sq). The ring
// traffic each rank sends per optimizer step: stages 0-2 one reduce-scatter of gradients and
// one all-gather of parameters, (N−1)/N·(g + p)Ψ (for fp32: 2(N−1)/N·4Ψ); stage 3 gathers the
// parameters twice (forward and backward), (N−1)/N·(g + 2p)Ψ.
// Chapters print these formulas beside their ledger; common/zero/memory_calculator.hpp prints them
// as a table for any Ψ and N (--memory-calculator on chapters 06-08).
// Leaves out: activations, temporary buffers and fragmentation (the paper's "residual
// states"), which ZeRO-DP does not shard and these formulas do not count.
#pragma once

#include <cmath>
#include <cstdint>
#include <string>

namespace ringzero {

/// Bytes per parameter of each model state.
struct StateBytes {
  double param = 4;      ///< p
  double grad = 4;       ///< g
  double optimizer = 8;  ///< K
  const char* name = "fp32 + Adam";
  /// p + g + K: bytes of one full copy of the model states per parameter.
  constexpr double per_param() const { return param + grad + optimizer; }
};
inline constexpr StateBytes kFp32Adam{4, 4, 8, "fp32 + Adam"};
inline constexpr StateBytes kMixedPrecisionAdam{2, 2, 12, "mixed precision (fp16/bf16) + Adam"};

/// The fp32 model-state bytes of the chapters' --optimizer, as PyTorch's optimizers keep
/// them: AdamW K = 8 (exp_avg, exp_avg_sq), SGD with momentum > 0 K = 4 (momentum_buffer),
/// plain SGD K = 0 (no state). So 16Ψ, 12Ψ and 8Ψ for one full copy (p = g = 4).
/// Errors: none; an optimizer other than "sgd" is AdamW (validate() admits only the two).
inline StateBytes fp32_state_bytes(const std::string& optimizer, double momentum) {
  if (optimizer == "sgd")
    return momentum > 0 ? StateBytes{4, 4, 4, "fp32 + SGD with momentum"}
                        : StateBytes{4, 4, 0, "fp32 + SGD"};
  return StateBytes{4, 4, 8, "fp32 + AdamW"};
}

/// One full copy of the model states as the chapters' formula line writes it:
/// "4Ψ + 4Ψ + 8Ψ = 16Ψ" (AdamW), "4Ψ + 4Ψ + 4Ψ = 12Ψ" (SGD with momentum), "4Ψ + 4Ψ = 8Ψ"
/// (SGD: no optimizer term).
inline std::string full_copy_formula_text(StateBytes b) {
  auto n = [](double x) { return std::to_string(static_cast<int>(x)); };
  std::string s = n(b.param) + "Ψ + " + n(b.grad) + "Ψ";
  if (b.optimizer > 0) s += " + " + n(b.optimizer) + "Ψ";
  return s + " = " + n(b.param + b.grad + b.optimizer) + "Ψ";
}

/// Model-state bytes per rank, by state. total() is what the paper's Figure 1 shows.
struct ModelStateBytes {
  double parameters = 0, gradients = 0, optimizer_state = 0;
  double total() const { return parameters + gradients + optimizer_state; }
};

/// The formula of `zero_stage` (0 = DDP, 1, 2, 3) for psi parameters on world_size ranks.
/// Errors: none checked here (pure arithmetic); callers pass a stage in 0..3 and N >= 1.
inline ModelStateBytes zero_model_state_bytes(int zero_stage, double psi, int world_size,
                                              StateBytes b = kFp32Adam) {
  const double N = world_size;
  ModelStateBytes m{b.param * psi, b.grad * psi, b.optimizer * psi};
  if (zero_stage >= 1) m.optimizer_state /= N;
  if (zero_stage >= 2) m.gradients /= N;
  if (zero_stage >= 3) m.parameters /= N;
  return m;
}

/// The formula as text, in the ZeRO paper's notation (Ψ parameters): "4Ψ + 4Ψ + 8Ψ/N" for fp32
/// ZeRO-1.
/// With K_os = 0 (plain SGD) the optimizer term is left out: "4Ψ + 4Ψ" for ZeRO-1.
inline std::string zero_formula_text(int zero_stage, StateBytes b = kFp32Adam) {
  auto n = [](double x) { return std::to_string(static_cast<int>(x)); };
  const bool k = b.optimizer > 0;
  switch (zero_stage) {
    case 0:
      return "(" + n(b.param) + " + " + n(b.grad) + (k ? " + " + n(b.optimizer) : "") + ")Ψ";
    case 1:
      return n(b.param) + "Ψ + " + n(b.grad) + "Ψ" + (k ? " + " + n(b.optimizer) + "Ψ/N" : "");
    case 2:
      return n(b.param) + "Ψ + " +
             (k ? "(" + n(b.grad) + " + " + n(b.optimizer) + ")" : n(b.grad)) + "Ψ/N";
    default:
      return "(" + n(b.param) + " + " + n(b.grad) + (k ? " + " + n(b.optimizer) : "") + ")Ψ/N";
  }
}

/// "DDP", "ZeRO-1", "ZeRO-2", "ZeRO-3".
inline std::string zero_stage_name(int zero_stage) {
  return zero_stage == 0 ? "DDP" : "ZeRO-" + std::to_string(zero_stage);
}

/// Bytes each rank sends per optimizer step with bandwidth-optimal (ring) collectives, in the
/// limit where every chunk is Ψ/N: stages 0-2 (N−1)/N·(g + p)Ψ, stage 3 (N−1)/N·(g + 2p)Ψ.
/// The chapters also compute the exact value from their chunk sizes; this is the paper's.
inline double zero_bytes_sent_per_rank(int zero_stage, double psi, int world_size,
                                       StateBytes b = kFp32Adam) {
  const double N = world_size;
  return (N - 1) / N * (b.grad + (zero_stage == 3 ? 2 : 1) * b.param) * psi;
}

}  // namespace ringzero
