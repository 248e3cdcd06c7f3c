// rng: a small deterministic random number generator.
//
// Provides: Rng, a counter-free SplitMix64 stream keyed by (seed, stream). The same seed gives
// the same numbers on every machine, compiler and world size, because nothing here goes through
// std::uniform_*_distribution (whose algorithms the C++ standard leaves to the library).
// Leaves out: cryptographic quality, parallel jump-ahead.
#pragma once

#include <cmath>
#include <cstdint>

namespace ringzero {

/// SplitMix64 (Steele, Lea, Flood 2014, "Fast splittable pseudorandom number generators").
class Rng {
 public:
  /// `stream` separates independent uses of one seed (init, data, shuffle of epoch e, ...).
  explicit Rng(uint64_t seed, uint64_t stream = 0)
      : state_(seed * 0x9E3779B97F4A7C15ull ^
               (stream + 0xD1B54A32D192ED03ull) * 0xBF58476D1CE4E5B9ull) {
    next_u64();
  }

  uint64_t next_u64() {
    uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }

  /// Uniform in [0, 1) with 24 random bits: exactly representable as float.
  float uniform() { return static_cast<float>(next_u64() >> 40) * (1.0f / 16777216.0f); }

  /// Uniform in [lo, hi).
  float uniform(float lo, float hi) { return lo + (hi - lo) * uniform(); }

  /// Uniform integer in [0, n), n > 0; Lemire's multiply-shift (bias below 2^-32 for n < 2^32).
  uint64_t below(uint64_t n) {
    __extension__ using u128 = unsigned __int128;  // GCC/Clang extension; -Wpedantic knows
    return static_cast<uint64_t>((static_cast<u128>(next_u64()) * n) >> 64);
  }

  /// Standard normal via Box-Muller (one value per call; the pair's second half is dropped
  /// to keep the stream position independent of how many normals were drawn before).
  float normal() {
    double u1 = (static_cast<double>(next_u64() >> 11) + 1.0) * 0x1.0p-53;  // (0, 1]
    double u2 = static_cast<double>(next_u64() >> 11) * 0x1.0p-53;          // [0, 1)
    return static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2));
  }

 private:
  uint64_t state_;
};

}  // namespace ringzero
