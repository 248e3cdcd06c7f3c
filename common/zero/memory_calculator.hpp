// memory_calculator: --memory-calculator on chapters 06-08, the ZeRO paper's model-state
// formulas (common/zero/zero_memory.hpp, which it models) printed as a table for any Ψ and N.
//
// Provides: MemoryCalculatorFlags (--memory-calculator --params 7e9 --world-size 8
// [--mixed-precision]), add_memory_calculator_flags(), memory_calculator() (the table),
// zero_memory_table() and its number formatting (gigabytes, pad_right).
// Leaves out: the formulas themselves (zero_memory.hpp).
#pragma once

#include <CLI/CLI.hpp>

#include <cmath>
#include <cstdlib>

#include <cstdio>
#include <string>

#include "common/zero/zero_memory.hpp"

namespace ringzero {

/// Decimal gigabytes with at most one decimal, as the ZeRO paper prints them:
/// 112e9 -> "112", 38.5e9 -> "38.5", 1.875e9 -> "1.9"; below 1 GB two: 0.234e9 -> "0.23".
inline std::string gigabytes(double bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, bytes < 1e9 ? "%.2f" : "%.1f", bytes / 1e9);
  std::string s = buf;
  while (s.back() == '0') s.pop_back();  // "112.0" -> "112", "0.20" -> "0.2"
  if (s.back() == '.') s.pop_back();
  return s;
}

/// s padded with spaces to `width` characters (UTF-8 aware: "Ψ" is one character, two bytes).
inline std::string pad_right(std::string s, size_t width) {
  size_t chars = 0;
  for (unsigned char c : s) chars += (c & 0xC0) != 0x80;
  if (chars < width) s.append(width - chars, ' ');
  return s;
}

/// The memory calculator's table: one line per stage (parameters, gradients, optimizer
/// state, total per rank, in GB) and the traffic per rank per step.
inline std::string zero_memory_table(double psi, int world_size, StateBytes b = kFp32Adam) {
  char line[256];
  char count[32];
  std::snprintf(count, sizeof count, psi >= 1e9 ? "%.4g billion" : "%.0f",
                psi >= 1e9 ? psi / 1e9 : psi);
  std::snprintf(line, sizeof line,
                "model states per rank: Ψ = %s parameters, N = %d ranks, %s (p = %g, g = %g, K = "
                "%g bytes per parameter)\n",
                count, world_size, b.name, b.param, b.grad, b.optimizer);
  std::string out = line;
  std::snprintf(line, sizeof line, "  %-7s | %-20s | %10s | %10s | %10s | %10s\n", "stage",
                "formula", "parameters", "gradients", "optimizer", "total");
  out += line;
  for (int stage = 0; stage <= 3; ++stage) {
    const ModelStateBytes m = zero_model_state_bytes(stage, psi, world_size, b);
    std::snprintf(line, sizeof line, "  %-7s | %s | %7s GB | %7s GB | %7s GB | %7s GB\n",
                  zero_stage_name(stage).c_str(),
                  pad_right(zero_formula_text(stage, b), 20).c_str(),
                  gigabytes(m.parameters).c_str(), gigabytes(m.gradients).c_str(),
                  gigabytes(m.optimizer_state).c_str(), gigabytes(m.total()).c_str());
    out += line;
  }
  std::snprintf(line, sizeof line,
                "sent per rank per step (ring): DDP, ZeRO-1, ZeRO-2 (N-1)/N·(g + p)Ψ = %s GB; "
                "ZeRO-3 (N-1)/N·(g + 2p)Ψ = %s GB\n",
                gigabytes(zero_bytes_sent_per_rank(0, psi, world_size, b)).c_str(),
                gigabytes(zero_bytes_sent_per_rank(3, psi, world_size, b)).c_str());
  return out + line +
         "(activations, buffers and fragmentation are not model states: see docs/memory.md)\n";
}

/// Flags of the memory calculator, shared by the ZeRO chapters:
///   --memory-calculator --params 7e9 --world-size 8 [--mixed-precision]
struct MemoryCalculatorFlags {
  bool enabled = false;
  double params = 7e9;
  int world_size = 8;
  bool mixed_precision = false;
};

inline void add_memory_calculator_flags(CLI::App& app, MemoryCalculatorFlags& f) {
  auto* group = app.add_option_group(
      "memory calculator", "print the ZeRO memory table and exit (no training, no MPI job needed)");
  group->add_flag("--memory-calculator", f.enabled,
                  "print model-state bytes per rank of DDP and ZeRO-1/2/3 and exit");
  // CLI::Range compares, and every comparison with NaN is false: nan would pass it.
  const CLI::Validator finite_params(
      [](std::string& v) -> std::string {
        char* end = nullptr;
        const double x = std::strtod(v.c_str(), &end);
        if (v.empty() || *end != '\0') return "'" + v + "' is not a number; give e.g. 7e9";
        if (!std::isfinite(x)) return v + " is not a finite number; give e.g. 7e9";
        if (x < 1 || x > 1e15) return v + " is not in [1, 1e15]; give e.g. 7e9";
        return "";
      },
      "NUMBER in [1, 1e15]");
  group->add_option("--params", f.params, "Ψ, number of parameters (e.g. 7e9)")
      ->check(finite_params);
  group->add_option("--world-size", f.world_size, "N, number of ranks")
      ->check(CLI::Range(1, 1 << 20));
  group->add_flag("--mixed-precision", f.mixed_precision,
                  "p = g = 2, K = 12 (the ZeRO paper's Figure 1) instead of fp32 + Adam");
}

/// The table the flags ask for.
inline std::string memory_calculator(const MemoryCalculatorFlags& f) {
  return zero_memory_table(f.params, f.world_size,
                           f.mixed_precision ? kMixedPrecisionAdam : kFp32Adam);
}

}  // namespace ringzero
