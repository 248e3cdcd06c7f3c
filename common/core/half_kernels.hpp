// half_kernels: the 16-bit element conversions, written once for the CPU and the GPU.
//
// Provides: RZ_HD, which marks a function __host__ __device__ when nvcc compiles it and is empty
// for the C++ compiler, and the scalar conversions float <-> bf16 and float <-> fp16 (round to
// nearest, ties to even; the formats and their rules: common/core/half.hpp). common/core/half.cpp
// calls them (its span loops vectorise the same rules) and common/device/gpu/kernels.cu runs them
// one thread per element, so a 16-bit value is the same bits on both devices. Apart from
// common/core/kernels.hpp because every file that includes half.hpp includes this one, and
// kernels.hpp holds exercise regions (common/core/optim.hpp says why that matters).
// Leaves out: the span loops and Buffer16 (half.hpp), stochastic rounding, fp8.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define RZ_HD __host__ __device__
#else
#define RZ_HD
#endif

namespace ringzero::kernels {

/// x's bits as a To of the same size (std::bit_cast, which nvcc's device pass lacks):
/// bits_as<uint32_t>(1.0f) is 0x3f800000.
template <class To, class From>
RZ_HD inline To bits_as(From x) {
  static_assert(sizeof(To) == sizeof(From));
  To y;
  __builtin_memcpy(&y, &x, sizeof(To));
  return y;
}

/// float -> bf16 bits, round to nearest even; NaN -> quiet NaN with the same sign.
RZ_HD inline uint16_t float_to_bf16(float f) {
  uint32_t u = bits_as<uint32_t>(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x0040u);
  // Adding 0x7fff plus the lowest kept bit rounds the upper half to nearest, ties to even;
  // a carry out of the mantissa increments the exponent, which is the correct rounding
  // (up to inf past the largest finite bf16).
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

/// bf16 bits -> float (exact: the bits become the upper half of a float32).
RZ_HD inline float bf16_to_float(uint16_t h) {
  return bits_as<float>(static_cast<uint32_t>(h) << 16);
}

/// float -> fp16 bits, round to nearest even; |f| >= 65520 (halfway past 65504) -> ±inf;
/// values below 2^-14 become subnormals (or ±0 below 2^-25); NaN -> quiet NaN, same sign.
RZ_HD inline uint16_t float_to_fp16(float f) {
  uint32_t u = bits_as<uint32_t>(f);
  const auto sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  u &= 0x7fffffffu;
  if (u > 0x7f800000u)  // NaN: quiet bit set, the upper payload bits kept (as vcvtps2ph)
    return static_cast<uint16_t>(sign | 0x7e00u | ((u >> 13) & 0x3ffu));
  if (u >= 0x477ff000u) return sign | 0x7c00u;  // >= 65520 (and inf): rounds to inf
  if (u >= 0x38800000u) {                       // >= 2^-14: a normal fp16
    u += 0xfffu + ((u >> 13) & 1u);             // round the 13 dropped bits, ties to even
    return static_cast<uint16_t>(sign | ((u - 0x38000000u) >> 13));  // rebias 127 -> 15
  }
  if (u < 0x33000000u) return sign;  // below 2^-25: rounds to ±0
  // A subnormal fp16: the value in units of 2^-24 is mant >> shift, rounded to nearest even.
  const uint32_t exp = u >> 23;
  const uint32_t mant = (u & 0x7fffffu) | 0x800000u;
  const uint32_t shift = 126 - exp;  // 14..24
  uint32_t r = mant >> shift;
  const uint32_t rem = mant & ((1u << shift) - 1u), half = 1u << (shift - 1);
  if (rem > half || (rem == half && (r & 1u))) ++r;  // r = 0x400 is the smallest normal
  return static_cast<uint16_t>(sign | r);
}

/// fp16 bits -> float (exact).
RZ_HD inline float fp16_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
  if (exp == 0x1f) return bits_as<float>(sign | 0x7f800000u | (mant << 13));
  if (exp != 0) return bits_as<float>(sign | ((exp + 112) << 23) | (mant << 13));
  const float v = static_cast<float>(mant) * 0x1p-24f;  // a subnormal: exact, mant < 2^10
  return bits_as<float>(bits_as<uint32_t>(v) | sign);
}

/// The conversions on a 16-bit format chosen at run time (bf16 when `bf16`, else fp16).
RZ_HD inline uint16_t float_to_half(bool bf16, float f) {
  return bf16 ? float_to_bf16(f) : float_to_fp16(f);
}
RZ_HD inline float half_to_float(bool bf16, uint16_t h) {
  return bf16 ? bf16_to_float(h) : fp16_to_float(h);
}

}  // namespace ringzero::kernels
