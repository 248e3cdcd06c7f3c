// checked: int64 arithmetic for derived sizes that fails with a message instead of wrapping.
//
// Provides: checked_mul / checked_add (throw ringzero::Error naming what overflowed, the two
// operands and the fix) and checked_product over a list. Every size derived from flags or file
// headers (global batch products, parameter counts, step counts, byte counts) goes through
// these, so `--grad-accum-steps 2^62` at np 4 is an error naming the flag, not a SIGFPE.
// Uses the GCC/Clang builtins __builtin_mul_overflow / __builtin_add_overflow (exact, no UB).
// Leaves out: unsigned and floating-point sizes.
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include "common/core/check.hpp"

namespace ringzero {

/// The largest byte count a derived size may reach before it is rejected as more than any
/// machine this code runs on could allocate: 2^50 bytes (1 PiB).
inline constexpr int64_t kMaxBytes = int64_t{1} << 50;

/// a * b. Errors: the product leaves int64; the message is "<what>: a x b overflows int64"
/// followed by `fix`.
inline int64_t checked_mul(int64_t a, int64_t b, const std::string& what,
                           const std::string& fix = "") {
  int64_t r = 0;
  RZ_CHECK(!__builtin_mul_overflow(a, b, &r), what << ": " << a << " x " << b << " overflows int64"
                                                   << (fix.empty() ? "" : "; ") << fix);
  return r;
}

/// a + b. Errors: the sum leaves int64 (message as checked_mul's).
inline int64_t checked_add(int64_t a, int64_t b, const std::string& what,
                           const std::string& fix = "") {
  int64_t r = 0;
  RZ_CHECK(!__builtin_add_overflow(a, b, &r), what << ": " << a << " + " << b << " overflows int64"
                                                   << (fix.empty() ? "" : "; ") << fix);
  return r;
}

/// The product of `factors` (1 for none). Errors: as checked_mul.
inline int64_t checked_product(std::span<const int64_t> factors, const std::string& what,
                               const std::string& fix = "") {
  int64_t r = 1;
  for (int64_t f : factors) r = checked_mul(r, f, what, fix);
  return r;
}

}  // namespace ringzero
